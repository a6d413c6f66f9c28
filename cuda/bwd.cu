// hf_flashpatch: FlashAttention-2 backward (mma.sync m16n8k16, ldmatrix, cp.async), bf16/fp16.
//
// Layout: q/dO (batch, seqlen_q, heads, head_dim), k/v/dk/dv (batch, seqlen_k, kv_heads, head_dim),
// any row/head/batch strides with the last dim contiguous; varlen packs sequences along the token
// dim (batch stride 0, sequence b starts at cu_seqlens[b]). Query head h reads KV head h / group.
//
// Kernels (one build per head dim / dtype / softcap; the macros are listed in bwd_common.cuh):
//   bwd_preprocess  D = rowsum(dO * O) - dLSE (fp32) and lse2 = lse * log2(e) (+inf where lse = -inf,
//                   so exp2(s - lse2) = 0 for rows that see no key), into (B, H, rows_pad) workspaces.
//   bwd_dkdv        one block per (K/V tile, kv head, batch); loops over the group's query heads and
//                   the query tiles that can see the tile, recomputing P^T = exp2(K Q^T * c - lse2)
//                   with keys as MMA rows, so P^T and dS^T are A operands straight from registers:
//                   dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - D), dK += dS^T Q. dK/dV stay in
//                   registers for the whole block (no repeat_kv, no atomics: deterministic).
//                   With ACCUM_DQ it also writes dS^T to shared memory and adds dQ += dS K into an
//                   fp32 workspace with atomics (bwd_convert_dq then scales and casts it).
//                   On Hopper, BWD_WGMMA=1 replaces that kernel's body with bwd_hopper.cuh's (wgmma).
//   bwd_dq          the deterministic alternative: one block per (query tile, head, batch) loops over
//                   the visible K/V tiles recomputing S, P, dP, dS with queries as MMA rows and
//                   accumulates dQ in registers (no atomics; costs 2 extra GEMMs of the 5).
// Softcap: c = softcap * tanh(s / softcap); dS w.r.t. s is dS_c * (1 - tanh^2).
// Files: bwd_common.cuh (configuration, shared helpers), bwd_default.cuh (the default dK/dV body),
// bwd_tiled.cuh and bwd_hopper.cuh (the other bodies), this file (the kernels' entry points).
#include "bwd_common.cuh"
#include "bwd_default.cuh"
#include "tma.cuh"

#if HEAD_DIM_V != HEAD_DIM && !BWD_WGMMA
#error "a v head dim of its own is served by the wgmma body only (BWD_WGMMA=1)"
#endif

using namespace hfp;
using namespace hfp::bwd;

// --------------------------------------------------------------------------------- preprocess
// grid (ceil(rows_pad / 32), heads, batch_ws), 128 threads: 4 threads per row, 32 rows per block.
// out/dout rows of kDv; lse: (batch_ws, heads, rows_valid) fp32 contiguous; dlse same or null. Workspaces
// (batch_ws, heads, rows_pad). Varlen (cu_q, num_seqs): tokens past cu_q[num_seqs] belong to no sequence and
// get the padded rows' values whatever their out / dout / lse hold (NaN too), as rows the bodies mask.
// dq_accum (batch_ws, heads, rows_pad, kD) fp32 or null: the block also zeroes its 32 rows of it, which the dK/dV
// kernel then adds dQ into (one pass over memory where a separate memset took its own).
extern "C" __global__ void __launch_bounds__(128) bwd_preprocess(
    const T* __restrict__ out, const T* __restrict__ dout, const float* __restrict__ lse,
    const float* __restrict__ dlse, float* __restrict__ lse2_ws, float* __restrict__ dvec_ws,
    float* __restrict__ dq_accum, const int* __restrict__ cu_q, int num_seqs, int64_t o_sb, int64_t o_ss,
    int64_t o_sh, int64_t do_sb, int64_t do_ss, int64_t do_sh, int heads, int rows_valid, int rows_pad) {
  const int row = blockIdx.x * 32 + threadIdx.x / 4, part = threadIdx.x % 4;
  const int h = blockIdx.y, bw = blockIdx.z;
  if (dq_accum != nullptr) {  // the block's 32 rows x kD floats, 16 bytes per thread per pass, coalesced
    float4* rows = reinterpret_cast<float4*>(dq_accum + ((int64_t(bw) * heads + h) * rows_pad + blockIdx.x * 32) * kD);
#pragma unroll
    for (int i = threadIdx.x; i < 32 * kD / 4; i += 128) rows[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  float acc = 0.f;
  const bool valid = row < (cu_q == nullptr ? rows_valid : min(rows_valid, cu_q[num_seqs]));
  if (valid) {
    const T* o = out + bw * o_sb + row * o_ss + h * o_sh;
    const T* d = dout + bw * do_sb + row * do_ss + h * do_sh;
#pragma unroll
    for (int c = part * 8; c < kDv; c += 32) {  // out and dout rows have v's head dim
      const uint4 ov = *reinterpret_cast<const uint4*>(o + c);
      const uint4 dv = *reinterpret_cast<const uint4*>(d + c);
      const uint32_t* op = reinterpret_cast<const uint32_t*>(&ov);
      const uint32_t* dp = reinterpret_cast<const uint32_t*>(&dv);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 a = Traits::unpack2(op[e]), b = Traits::unpack2(dp[e]);
        acc += a.x * b.x + a.y * b.y;
      }
    }
  }
  acc = quad_sum(acc);
  if (part == 0 && row < rows_pad) {
    const int64_t ws = (int64_t(bw) * heads + h) * rows_pad + row;
    float l = __int_as_float(0x7f800000);  // +inf: padded rows and rows that see no key give P = 0
    float dv = 0.f;
    if (valid) {
      const int64_t li = (int64_t(bw) * heads + h) * rows_valid + row;
      const float x = lse[li];
      if (x != -__int_as_float(0x7f800000)) l = x * kLog2e;
      dv = acc - (dlse != nullptr ? dlse[li] : 0.f);
    }
    lse2_ws[ws] = l;
    dvec_ws[ws] = dv;
  }
}


#if BWD_TILED
#include "bwd_tiled.cuh"
#endif
#if BWD_WGMMA
#include "bwd_hopper.cuh"
#endif


// grid: dkdv_grid in hf_flashpatch/kernels/backward.py (key blocks x kv heads x batch, in the order heavy_first
// names; see dkdv_block), kThreads threads.
// The dynamic shared memory of each entry point, read by the launch from the compiled module
// (hf_flashpatch/kernels/build.py, Kernel.shared_bytes).
#if BWD_WGMMA
extern "C" __constant__ int bwd_dkdv_dq_atomic_shared_bytes = kHSmemBytes + 1024;
#elif BWD_TILED
extern "C" __constant__ int bwd_dkdv_dq_atomic_shared_bytes = kTiledSharedBytes;
#else
extern "C" __constant__ int bwd_dkdv_dq_atomic_shared_bytes = kDefaultSharedBytes;
#endif
#if HEAD_DIM_V == HEAD_DIM  // the deterministic pair takes one head dim (v's own: the padded route)
extern "C" __constant__ int bwd_dkdv_shared_bytes = kDefaultSharedBytes;
extern "C" __constant__ int bwd_dq_shared_bytes = (2 * kQBlockM + 4 * kQBlockN) * kPadD * 2;  // bwd_dq's carve-up
#endif

// The TMA maps the wgmma body reads (kernels/backward.py, _tensor_maps): its loads of q, dout and the
// lse2 / D workspace, and (d64 / d128) its reduce-add into dq_accum. The other bodies do not read them.
extern "C" __global__ void __launch_bounds__(kThreads, 1)
    bwd_dkdv_dq_atomic(const __grid_constant__ hfp::TmaDescriptor dq_map, const __grid_constant__ hfp::TmaDescriptor q_map,
                       const __grid_constant__ hfp::TmaDescriptor do_map,
                       const __grid_constant__ hfp::TmaDescriptor stats_map, HFP_DKDV_PARAMS) {
#if BWD_WGMMA
  dkdv_wgmma_body(dq_map, q_map, do_map, stats_map, HFP_DKDV_ARGS);  // all five GEMMs on wgmma (bwd_hopper.cuh)
#elif BWD_TILED
  dkdv_tiled_body(HFP_DKDV_ARGS);  // 2-D warp tiling of all five GEMMs (cuda/bwd_tiled.cuh)
#else
  dkdv_body<true>(HFP_DKDV_ARGS);
#endif
}
#if HEAD_DIM_V == HEAD_DIM
extern "C" __global__ void __launch_bounds__(kThreads, 1) bwd_dkdv(HFP_DKDV_PARAMS) {
  dkdv_body<false>(HFP_DKDV_ARGS);
}
#endif

// --------------------------------------------------------------------------------- dQ convert
// dq (tokens, heads, D) in q's dtype, token = bw * rows_valid + row; dq_accum (batch_ws, heads, rows_pad, D).
// grid (ceil(rows_valid * D / 8 / 256), heads, batch_ws), 256 threads, 8 elements per thread.
extern "C" __global__ void __launch_bounds__(256) bwd_convert_dq(const float* __restrict__ dq_accum, T* __restrict__ dq,
                                                                 int heads, int rows_valid, int rows_pad, float scale) {
  const int64_t idx = (int64_t(blockIdx.x) * 256 + threadIdx.x) * 8;
  const int h = blockIdx.y, bw = blockIdx.z;
  if (idx >= int64_t(rows_valid) * kD) return;
  const int row = int(idx / kD), col = int(idx % kD);
  const float* src = dq_accum + ((int64_t(bw) * heads + h) * rows_pad + row) * kD + col;
  const float4 a = *reinterpret_cast<const float4*>(src), c = *reinterpret_cast<const float4*>(src + 4);
  uint4 o;
  o.x = Traits::pack2(a.x * scale, a.y * scale);
  o.y = Traits::pack2(a.z * scale, a.w * scale);
  o.z = Traits::pack2(c.x * scale, c.y * scale);
  o.w = Traits::pack2(c.z * scale, c.w * scale);
  *reinterpret_cast<uint4*>(dq + ((int64_t(bw) * rows_valid + row) * heads + h) * kD + col) = o;
}

#if HEAD_DIM_V == HEAD_DIM
// --------------------------------------------------------------------------------- dQ pass (deterministic)
// grid (ceil(max_seqlen_q / kQBlockM), heads, batch), kQThreads threads. dq (tokens, heads, D) contiguous.
extern "C" __global__ void __launch_bounds__(kQThreads, 1) bwd_dq(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
    const float* __restrict__ lse2_ws, const float* __restrict__ dvec_ws, T* __restrict__ dq,
    const int* __restrict__ cu_q, const int* __restrict__ cu_k, int64_t q_sb, int64_t q_ss, int64_t q_sh,
    int64_t k_sb, int64_t k_ss, int64_t k_sh, int64_t v_sb, int64_t v_ss, int64_t v_sh, int64_t do_sb,
    int64_t do_ss, int64_t do_sh, int seqlen_q, int seqlen_k, int heads, int kv_heads, int rows_pad,
    float softmax_scale, float scale_log2, float softcap_pre, float softcap_log2, int left, int right, int total_q,
    int total_k) {
  extern __shared__ __align__(16) unsigned char dq_smem_raw[];
  T* q_s = reinterpret_cast<T*>(dq_smem_raw);  // (kQBlockM, kPadD)
  T* do_s = q_s + kQBlockM * kPadD;          // (kQBlockM, kPadD)
  T* k_s = do_s + kQBlockM * kPadD;          // (2 stages, kQBlockN, kPadD)
  T* v_s = k_s + 2 * kQBlockN * kPadD;       // (2 stages, kQBlockN, kPadD)

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  // Last query block first: with a causal mask it sees the most keys (heaviest first; neutral otherwise).
  const int m_block = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int2 sq = sequence(cu_q, b, seqlen_q, total_q), sk = sequence(cu_k, b, seqlen_k, total_k);
  const int m0 = m_block * kQBlockM;
  if (m0 >= sq.y) return;
  const Visibility vis = visibility(sq.y, sk.y, left, right);
  const ScoreScale sc{scale_log2, softcap_pre, softcap_log2};
  const int hk = h / (heads / kv_heads);
  const int bw = cu_q == nullptr ? b : 0;

  load_tile<kQBlockM, kQThreads>(q_s, q + b * q_sb + int64_t(sq.x + m0) * q_ss + h * q_sh, q_ss, sq.y - m0, tid);
  load_tile<kQBlockM, kQThreads>(do_s, dout + b * do_sb + int64_t(sq.x + m0) * do_ss + h * do_sh, do_ss, sq.y - m0, tid);
  cp_async_commit();

  const int row0 = warp * 16;
  const int64_t ws = (int64_t(bw) * heads + h) * rows_pad + sq.x + m0 + row0 + g;
  const float lse_lo = lse2_ws[ws], lse_hi = lse2_ws[ws + 8];
  const float d_lo = dvec_ws[ws], d_hi = dvec_ws[ws + 8];

  const int2 kr = vis.key_range(m0, min(m0 + kQBlockM, sq.y));
  const int n_first = max(kr.x, 0) / kQBlockN;
  const int steps = kr.y > kr.x ? (kr.y - n_first * kQBlockN + kQBlockN - 1) / kQBlockN : 0;
  auto load_kv = [&](int step, int stage) {
    const int n0 = (n_first + step) * kQBlockN;
    load_tile<kQBlockN, kQThreads>(k_s + stage * kQBlockN * kPadD,
                                   k + b * k_sb + int64_t(sk.x + n0) * k_ss + hk * k_sh, k_ss, sk.y - n0, tid);
    load_tile<kQBlockN, kQThreads>(v_s + stage * kQBlockN * kPadD,
                                   v + b * v_sb + int64_t(sk.x + n0) * v_ss + hk * v_sh, v_ss, sk.y - n0, tid);
  };
  if (steps > 0) load_kv(0, 0);
  cp_async_commit();

  float dq_acc[kD / 8][4];
  zero(dq_acc);
  for (int step = 0; step < steps; ++step) {
    const int stage = step & 1;
    if (step + 1 < steps) load_kv(step + 1, stage ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const int n0 = (n_first + step) * kQBlockN;
    const T* ks = k_s + stage * kQBlockN * kPadD;
    const T* vs = v_s + stage * kQBlockN * kPadD;

    float p[kQBlockN / 8][4];
    zero(p);
    gemm_ss_nt<kQBlockN, kD>(p, q_s + row0 * kPadD, kPadD, ks, kPadD, lane);
#if HAS_SOFTCAP
    float dtanh[kQBlockN / 8][4];
#endif
    const bool full = vis.tile_all_visible(m0, m0 + kQBlockM, n0, n0 + kQBlockN);
#pragma unroll
    for (int j = 0; j < kQBlockN / 8; ++j) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int col = j * 8 + 2 * t4 + (r & 1);
        float dt = 1.f;
        float x = exp2f(sc.logit2<HAS_SOFTCAP != 0>(p[j][r], dt) - (r < 2 ? lse_lo : lse_hi));
        if (!full && !vis.visible(m0 + row0 + g + (r >> 1) * 8, n0 + col)) x = 0.f;
        p[j][r] = x;
#if HAS_SOFTCAP
        dtanh[j][r] = dt;
#endif
      }
    }
    float ds[kQBlockN / 8][4];
    zero(ds);
    gemm_ss_nt<kQBlockN, kD>(ds, do_s + row0 * kPadD, kPadD, vs, kPadD, lane);
#pragma unroll
    for (int j = 0; j < kQBlockN / 8; ++j) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        ds[j][r] = p[j][r] * (ds[j][r] - (r < 2 ? d_lo : d_hi));
#if HAS_SOFTCAP
        ds[j][r] *= dtanh[j][r];
#endif
      }
    }
    uint32_t dsa[kQBlockN / 16][4];
    pack_a_fragments<kBf16, kQBlockN>(dsa, ds);
    gemm_rs_nn<kD, kQBlockN>(dq_acc, dsa, ks, kPadD, lane);
    __syncthreads();
  }
  cp_async_wait<0>();

  const int row = m0 + row0 + g;
  const int64_t tok = cu_q == nullptr ? int64_t(b) * seqlen_q + row : int64_t(sq.x) + row;
  T* dq_row = dq + (tok * heads + h) * kD;
  const int64_t row8 = int64_t(8) * heads * kD;
#pragma unroll
  for (int j = 0; j < kD / 8; ++j) {
    const int col = j * 8 + 2 * t4;
    if (row < sq.y)
      *reinterpret_cast<uint32_t*>(dq_row + col) = Traits::pack2(dq_acc[j][0] * softmax_scale, dq_acc[j][1] * softmax_scale);
    if (row + 8 < sq.y)
      *reinterpret_cast<uint32_t*>(dq_row + row8 + col) = Traits::pack2(dq_acc[j][2] * softmax_scale, dq_acc[j][3] * softmax_scale);
  }
}
#endif  // HEAD_DIM_V == HEAD_DIM
