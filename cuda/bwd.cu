// hf_flashpatch: FlashAttention-2 backward (mma.sync m16n8k16, ldmatrix, cp.async), bf16/fp16.
//
// Layout: q/dO (batch, seqlen_q, heads, head_dim), k/v/dk/dv (batch, seqlen_k, kv_heads, head_dim),
// any row/head/batch strides with the last dim contiguous; varlen packs sequences along the token
// dim (batch stride 0, sequence b starts at cu_seqlens[b]). Query head h reads KV head h / group.
//
// Kernels (one build per head dim / dtype / softcap, macros below):
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
#include "primitives.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef ELEM_BF16
#define ELEM_BF16 1
#endif
#ifndef BLOCK_M  // query rows per inner step of bwd_dkdv
#define BLOCK_M 64
#endif
#ifndef NUM_WARPS  // warps of bwd_dkdv
#define NUM_WARPS 8
#endif
#ifndef D_SPLIT  // warps sharing one 16-key row group in bwd_dkdv, each owning HEAD_DIM / D_SPLIT of dK/dV
#define D_SPLIT 1
#endif
#ifndef HAS_SOFTCAP
#define HAS_SOFTCAP 0
#endif
#ifndef DQ_BLOCK_N  // keys per inner step of bwd_dq
#define DQ_BLOCK_N 64
#endif
#ifndef DQ_WARPS  // warps of bwd_dq (16 query rows each)
#define DQ_WARPS 8
#endif
#ifndef DQ_KK_UNROLL
#define DQ_KK_UNROLL 2
#endif
#ifndef DQ_CHUNK  // dQ columns accumulated per pass in bwd_dkdv
#define DQ_CHUNK 32
#endif
#ifndef SS_UNROLL  // unroll of the head-dim loop of the K Q^T / V dO^T GEMMs
#define SS_UNROLL 2
#endif
#ifndef RS_UNROLL  // unroll of the query loop of the dV / dK GEMMs
#define RS_UNROLL 8
#endif
#ifndef PREFETCH_AFTER_SYNC  // bwd_dkdv: issue the next query tile's loads after the step's first barrier
#define PREFETCH_AFTER_SYNC 0
#endif
#ifndef DQ_WARP_ROWS  // query rows per warp in bwd_dkdv's dQ product (16 or 32)
#define DQ_WARP_ROWS 16
#endif
#ifndef BWD_TILED  // 1: bwd_dkdv_dq_atomic takes the 2-D warp-tiled body of bwd_tiled.cuh (d64/d128)
#define BWD_TILED 0
#endif
#ifndef BWD_WGMMA  // 1: bwd_dkdv_dq_atomic takes the Hopper wgmma body of bwd_hopper.cuh (sm_90a, d64/d128)
#define BWD_WGMMA 0
#endif
#ifndef MIN_BLOCKS  // __launch_bounds__ residency hint for bwd_dkdv
#define MIN_BLOCKS 1
#endif

namespace hfp {
namespace bwd {

constexpr bool kBf16 = ELEM_BF16 != 0;
using Traits = ElemTraits<kBf16>;
using T = typename Traits::T;
constexpr int kD = HEAD_DIM;
constexpr int kPadD = kD + 8;  // shared row stride (elements): +16 B makes ldmatrix rows hit distinct banks
constexpr int kBlockM = BLOCK_M;
constexpr int kWarps = NUM_WARPS;
constexpr int kThreads = kWarps * 32;
constexpr int kDSplit = D_SPLIT;
constexpr int kBlockN = (kWarps / kDSplit) * 16;  // keys per bwd_dkdv block
constexpr int kDw = kD / kDSplit;                 // dK/dV columns owned by one warp
constexpr int kPadM = kBlockM + 8;                // dS^T shared row stride
// dQ (in bwd_dkdv): warps tile the (BLOCK_M x D) output as kDqRowWarps x kDqColWarps, each warp
// kDqWarpRows query rows (16 or 32: 32 re-reads K half as often per MMA, for twice the accumulator)
constexpr int kDqWarpRows = DQ_WARP_ROWS;
constexpr int kDqMTiles = kDqWarpRows / 16;
constexpr int kDqRowWarps = (kBlockM / kDqWarpRows) < kWarps ? (kBlockM / kDqWarpRows) : kWarps;
constexpr int kDqColWarps = kWarps / kDqRowWarps;
constexpr int kDqCols = kD / kDqColWarps;
constexpr int kDqChunk = DQ_CHUNK < kDqCols ? DQ_CHUNK : kDqCols;  // dQ columns per pass
constexpr int kQBlockM = DQ_WARPS * 16;  // query rows per bwd_dq block
constexpr int kQBlockN = DQ_BLOCK_N;
constexpr int kQThreads = DQ_WARPS * 32;
constexpr int kDqUnroll = DQ_KK_UNROLL;
constexpr int kSsUnroll = SS_UNROLL;
constexpr int kRsUnroll = RS_UNROLL;

static_assert(kD % 16 == 0 && kDw % 16 == 0 && kDqCols % 16 == 0, "head dim tiling");
static_assert(kBlockM % kDqWarpRows == 0 && kDqRowWarps * kDqWarpRows <= kBlockM && kWarps % kDqRowWarps == 0 &&
                  kDqRowWarps * kDqColWarps == kWarps && kDqRowWarps * kDqWarpRows == kBlockM, "dQ warp tiling");
static_assert(kQBlockN % 16 == 0, "bwd_dq key tile");
static_assert(kDqCols % kDqChunk == 0 && kDqChunk % 16 == 0, "dQ column chunks must tile a warp's columns");

struct Visibility {
  // Query i (of seqlen_q) sees key j (of seqlen_k) iff j < seqlen_k, i < seqlen_q and
  // i + offset - left <= j <= i + offset + right (a negative bound is unbounded); offset = sk - sq
  // is the bottom-right alignment.
  int seqlen_q, seqlen_k, offset, left, right;
  __device__ __forceinline__ bool visible(int i, int j) const {
    return i < seqlen_q && j < seqlen_k && (left < 0 || j >= i + offset - left) &&
           (right < 0 || j <= i + offset + right);
  }
  // True when every (i, j) of the tile is visible, so the per-element test can be skipped.
  __device__ __forceinline__ bool tile_all_visible(int m0, int m1, int n0, int n1) const {
    return m1 <= seqlen_q && n1 <= seqlen_k && (right < 0 || n1 - 1 <= m0 + offset + right) &&
           (left < 0 || n0 >= m1 - 1 + offset - left);
  }
  // Query rows [begin, end) that see at least one key of [n0, n1).
  __device__ __forceinline__ int2 query_range(int n0, int n1) const {
    int begin = 0, end = seqlen_q;
    if (right >= 0) begin = max(begin, n0 - offset - right);
    if (left >= 0) end = min(end, n1 - 1 - offset + left + 1);
    return make_int2(begin, end);
  }
  // Key columns [begin, end) seen by at least one query of [m0, m1).
  __device__ __forceinline__ int2 key_range(int m0, int m1) const {
    int begin = 0, end = seqlen_k;
    if (left >= 0) begin = max(begin, m0 + offset - left);
    if (right >= 0) end = min(end, m1 - 1 + offset + right + 1);
    return make_int2(begin, end);
  }
};

__device__ __forceinline__ void cp_async_4(uint32_t smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem), "l"(gmem));
}

// Copy a (rows x kD) tile, row r at gmem + r * row_stride, rows >= valid_rows zero-filled.
template <int kRows, int kNThreads>
__device__ __forceinline__ void load_tile(T* smem, const T* gmem, int64_t row_stride, int valid_rows, int tid) {
  constexpr int kChunks = kD / 8;  // 16-byte chunks per row
#pragma unroll
  for (int c = tid; c < kRows * kChunks; c += kNThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool ok = r < valid_rows;
    const T* src = gmem + (ok ? r * row_stride : 0) + col;
    cp_async_16(smem_addr(smem + r * kPadD + col), src, ok);
  }
}

// acc (16 x N) += A (16 x K: shared [m][k], stride lda elements) * B^T (B shared [n][k], stride ldb).
template <int N, int K>
__device__ __forceinline__ void gemm_ss_nt(float (&acc)[N / 8][4], const T* a, int lda, const T* b, int ldb,
                                           int lane) {
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8, a_col = (lane >> 4) * 8;
  const int b_row = (lane >> 4) * 8 + (lane & 7), b_col = ((lane >> 3) & 1) * 8;
#pragma unroll kSsUnroll
  for (int kk = 0; kk < K / 16; ++kk) {
    uint32_t af[4];
    ldmatrix_x4(af, smem_addr(a + a_row * lda + kk * 16 + a_col));
#pragma unroll
    for (int p = 0; p < N / 16; ++p) {
      uint32_t bf[4];
      ldmatrix_x4(bf, smem_addr(b + (p * 16 + b_row) * ldb + kk * 16 + b_col));
      const uint32_t b0[2] = {bf[0], bf[1]}, b1[2] = {bf[2], bf[3]};
      mma_16816<kBf16>(acc[2 * p], af, b0);
      mma_16816<kBf16>(acc[2 * p + 1], af, b1);
    }
  }
}

// acc (16 x N) += A (16 x K, registers) * B (K x N: shared [k][n], stride ldb, columns from b).
template <int N, int K>
__device__ __forceinline__ void gemm_rs_nn(float (&acc)[N / 8][4], const uint32_t (&a)[K / 16][4], const T* b,
                                           int ldb, int lane) {
  const int b_row = ((lane >> 3) & 1) * 8 + (lane & 7), b_col = (lane >> 4) * 8;
#pragma unroll kRsUnroll
  for (int kk = 0; kk < K / 16; ++kk) {
#pragma unroll
    for (int p = 0; p < N / 16; ++p) {
      uint32_t bf[4];
      ldmatrix_x4_trans(bf, smem_addr(b + (kk * 16 + b_row) * ldb + p * 16 + b_col));
      const uint32_t b0[2] = {bf[0], bf[1]}, b1[2] = {bf[2], bf[3]};
      mma_16816<kBf16>(acc[2 * p], a[kk], b0);
      mma_16816<kBf16>(acc[2 * p + 1], a[kk], b1);
    }
  }
}

// Accumulator (16 x N fp32) -> A fragments (16 x N, b16): the mma C layout is the A layout.
template <int N>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[N / 16][4], const float (&acc)[N / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    a[kk][0] = Traits::pack2(acc[2 * kk][0], acc[2 * kk][1]);
    a[kk][1] = Traits::pack2(acc[2 * kk][2], acc[2 * kk][3]);
    a[kk][2] = Traits::pack2(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
    a[kk][3] = Traits::pack2(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
  }
}

template <int N>
__device__ __forceinline__ void zero(float (&acc)[N][4]) {
#pragma unroll
  for (int j = 0; j < N; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
}

struct Scores {
  float scale_log2;  // softmax_scale * log2(e)
  float softcap_in;  // softmax_scale / softcap (tanh argument per raw score)
  float softcap_out; // softcap * log2(e)
  // Raw dot product -> log2-domain logit; *dtanh receives 1 - tanh^2 for the softcap chain rule.
  __device__ __forceinline__ float logit(float s, float* dtanh) const {
#if HAS_SOFTCAP
    const float t = tanhf(s * softcap_in);
    *dtanh = 1.f - t * t;
    return t * softcap_out;
#else
    return s * scale_log2;
#endif
  }
};

// Sequence geometry of batch entry b: start token and length (varlen when cu != nullptr).
__device__ __forceinline__ int2 sequence(const int* cu, int b, int fixed_len) {
  if (cu == nullptr) return make_int2(0, fixed_len);
  const int s = cu[b];
  return make_int2(s, cu[b + 1] - s);
}

}  // namespace bwd
}  // namespace hfp

using namespace hfp;
using namespace hfp::bwd;

// --------------------------------------------------------------------------------- preprocess
// grid (ceil(rows_pad / 32), heads, batch_ws), 128 threads: 4 threads per row, 32 rows per block.
// lse: (batch_ws, heads, rows_valid) fp32 contiguous; dlse same or null. Workspaces (batch_ws, heads, rows_pad).
extern "C" __global__ void __launch_bounds__(128) bwd_preprocess(
    const T* __restrict__ out, const T* __restrict__ dout, const float* __restrict__ lse,
    const float* __restrict__ dlse, float* __restrict__ lse2_ws, float* __restrict__ dvec_ws,
    int64_t o_sb, int64_t o_ss, int64_t o_sh, int64_t do_sb, int64_t do_ss, int64_t do_sh,
    int heads, int rows_valid, int rows_pad) {
  const int row = blockIdx.x * 32 + threadIdx.x / 4, part = threadIdx.x % 4;
  const int h = blockIdx.y, bw = blockIdx.z;
  float acc = 0.f;
  const bool valid = row < rows_valid;
  if (valid) {
    const T* o = out + bw * o_sb + row * o_ss + h * o_sh;
    const T* d = dout + bw * do_sb + row * do_ss + h * do_sh;
#pragma unroll
    for (int c = part * 8; c < kD; c += 32) {
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

// --------------------------------------------------------------------------------- dK, dV (+ dQ atomics)
template <bool kAccumDq>
__device__ __forceinline__ void dkdv_body(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
    const float* __restrict__ lse2_ws, const float* __restrict__ dvec_ws, float* __restrict__ dq_accum,
    T* __restrict__ dk, T* __restrict__ dv, const int* __restrict__ cu_q, const int* __restrict__ cu_k,
    int64_t q_sb, int64_t q_ss, int64_t q_sh, int64_t k_sb, int64_t k_ss, int64_t k_sh, int64_t v_sb, int64_t v_ss,
    int64_t v_sh, int64_t do_sb, int64_t do_ss, int64_t do_sh, int seqlen_q, int seqlen_k, int heads, int kv_heads,
    int rows_pad, float softmax_scale, float scale_log2, float softcap_in, float softcap_out, int left, int right) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* k_s = reinterpret_cast<T*>(smem_raw);               // (kBlockN, kPadD)
  T* v_s = k_s + kBlockN * kPadD;                          // (kBlockN, kPadD)
  T* q_s = v_s + kBlockN * kPadD;                          // (2 stages, kBlockM, kPadD)
  T* do_s = q_s + 2 * kBlockM * kPadD;                     // (2 stages, kBlockM, kPadD)
  T* ds_s = do_s + 2 * kBlockM * kPadD;                    // (kBlockN, kPadM): dS^T, keys x queries
  float* lse_s = reinterpret_cast<float*>(ds_s + kBlockN * kPadM);  // (2, kBlockM)
  float* dvec_s = lse_s + 2 * kBlockM;                              // (2, kBlockM)

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int n_block = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const int2 sq = sequence(cu_q, b, seqlen_q), sk = sequence(cu_k, b, seqlen_k);
  const int n0 = n_block * kBlockN;
  if (n0 >= sk.y) return;
  const Visibility vis{sq.y, sk.y, sk.y - sq.y, left, right};
  const Scores sc{scale_log2, softcap_in, softcap_out};
  const int group = heads / kv_heads;
  const int bw = cu_q == nullptr ? b : 0;  // workspace batch index (varlen packs into one)

  const T* k_tile = k + b * k_sb + int64_t(sk.x + n0) * k_ss + hk * k_sh;
  const T* v_tile = v + b * v_sb + int64_t(sk.x + n0) * v_ss + hk * v_sh;
  load_tile<kBlockN, kThreads>(k_s, k_tile, k_ss, sk.y - n0, tid);
  load_tile<kBlockN, kThreads>(v_s, v_tile, v_ss, sk.y - n0, tid);
  cp_async_commit();

  int2 mr = vis.query_range(n0, min(n0 + kBlockN, sk.y));
  const int m_first = max(mr.x, 0) / kBlockM;
  const int m_count = mr.y > mr.x ? (mr.y - m_first * kBlockM + kBlockM - 1) / kBlockM : 0;
  const int steps = m_count * group;

  auto load_q_side = [&](int step, int stage) {
    const int h = hk * group + step / m_count;
    const int m0 = (m_first + step % m_count) * kBlockM;
    const T* q_tile = q + b * q_sb + int64_t(sq.x + m0) * q_ss + h * q_sh;
    const T* do_tile = dout + b * do_sb + int64_t(sq.x + m0) * do_ss + h * do_sh;
    load_tile<kBlockM, kThreads>(q_s + stage * kBlockM * kPadD, q_tile, q_ss, sq.y - m0, tid);
    load_tile<kBlockM, kThreads>(do_s + stage * kBlockM * kPadD, do_tile, do_ss, sq.y - m0, tid);
    const int64_t ws = (int64_t(bw) * heads + h) * rows_pad + sq.x + m0;
    if (tid < kBlockM) {
      cp_async_4(smem_addr(lse_s + stage * kBlockM + tid), lse2_ws + ws + tid);
    } else if (tid < 2 * kBlockM) {
      cp_async_4(smem_addr(dvec_s + stage * kBlockM + tid - kBlockM), dvec_ws + ws + tid - kBlockM);
    }
  };
  static_assert(2 * kBlockM <= kThreads, "lse/D tile load");

  const int key_row0 = (warp / kDSplit) * 16;  // this warp's 16 keys within the block
  const int dcol0 = (warp % kDSplit) * kDw;    // this warp's dK/dV columns
  float dv_acc[kDw / 8][4], dk_acc[kDw / 8][4];
  zero(dv_acc);
  zero(dk_acc);

  if (steps > 0) load_q_side(0, 0);
  cp_async_commit();

  for (int step = 0; step < steps; ++step) {
    const int stage = step & 1;
#if PREFETCH_AFTER_SYNC
    // Two barriers per step: once every warp is past this one it has finished the previous step, so
    // the other stage (and dS^T) may be overwritten; the prefetch is issued after it.
    cp_async_wait<0>();
    __syncthreads();
    if (step + 1 < steps) load_q_side(step + 1, stage ^ 1);
    cp_async_commit();
#else
    if (step + 1 < steps) load_q_side(step + 1, stage ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
#endif

    const int h = hk * group + step / m_count;
    const int m0 = (m_first + step % m_count) * kBlockM;
    const T* qs = q_s + stage * kBlockM * kPadD;
    const T* dos = do_s + stage * kBlockM * kPadD;
    const float* lses = lse_s + stage * kBlockM;
    const float* dvs = dvec_s + stage * kBlockM;

    // S^T (16 keys x kBlockM queries) = K Q^T
    float p[kBlockM / 8][4];
    zero(p);
    gemm_ss_nt<kBlockM, kD>(p, k_s + key_row0 * kPadD, kPadD, qs, kPadD, lane);
#if HAS_SOFTCAP
    float dtanh[kBlockM / 8][4];
#endif
    const bool full = vis.tile_all_visible(m0, m0 + kBlockM, n0, n0 + kBlockN);
#pragma unroll
    for (int j = 0; j < kBlockM / 8; ++j) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int col = j * 8 + 2 * t4 + (r & 1);
        float dt = 1.f;
        float x = exp2f(sc.logit(p[j][r], &dt) - lses[col]);
        if (!full && !vis.visible(m0 + col, n0 + key_row0 + g + (r >> 1) * 8)) x = 0.f;
        p[j][r] = x;
#if HAS_SOFTCAP
        dtanh[j][r] = dt;
#endif
      }
    }
    // dV (16 x kDw) += P^T dO
    {
      uint32_t pa[kBlockM / 16][4];
      acc_to_a<kBlockM>(pa, p);
      gemm_rs_nn<kDw, kBlockM>(dv_acc, pa, dos + dcol0, kPadD, lane);
    }
    // dP^T (16 x kBlockM) = V dO^T ; dS^T = P^T (dP^T - D)
    float ds[kBlockM / 8][4];
    zero(ds);
    gemm_ss_nt<kBlockM, kD>(ds, v_s + key_row0 * kPadD, kPadD, dos, kPadD, lane);
#pragma unroll
    for (int j = 0; j < kBlockM / 8; ++j) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int col = j * 8 + 2 * t4 + (r & 1);
        ds[j][r] = p[j][r] * (ds[j][r] - dvs[col]);
#if HAS_SOFTCAP
        ds[j][r] *= dtanh[j][r];
#endif
      }
    }
    uint32_t dsa[kBlockM / 16][4];
    acc_to_a<kBlockM>(dsa, ds);
    // dK (16 x kDw) += dS^T Q
    gemm_rs_nn<kDw, kBlockM>(dk_acc, dsa, qs + dcol0, kPadD, lane);

    if constexpr (kAccumDq) {
      if (warp % kDSplit == 0) {  // D_SPLIT warps hold identical dS^T: one writes it
#pragma unroll
        for (int j = 0; j < kBlockM / 8; ++j) {
          const int col = j * 8 + 2 * t4;
          *reinterpret_cast<uint32_t*>(ds_s + (key_row0 + g) * kPadM + col) = dsa[j / 2][(j & 1) * 2];
          *reinterpret_cast<uint32_t*>(ds_s + (key_row0 + g + 8) * kPadM + col) = dsa[j / 2][(j & 1) * 2 + 1];
        }
      }
      __syncthreads();
      // dQ (kBlockM x D) += dS K; this warp: kDqWarpRows query rows x kDqCols columns, kDqChunk at a time
      // (a smaller live accumulator next to the dK/dV registers; dS^T fragments are re-read per chunk).
      const int qrow0 = (warp % kDqRowWarps) * kDqWarpRows, qcol0 = (warp / kDqRowWarps) * kDqCols;
      const int a_key = (lane >> 4) * 8 + (lane & 7), a_q = ((lane >> 3) & 1) * 8;
      const int b_row = ((lane >> 3) & 1) * 8 + (lane & 7), b_col = (lane >> 4) * 8;
      const int64_t ws_row = (int64_t(bw) * heads + h) * rows_pad + sq.x + m0 + qrow0 + g;
#pragma unroll 1
      for (int c0 = qcol0; c0 < qcol0 + kDqCols; c0 += kDqChunk) {
        float dq[kDqMTiles][kDqChunk / 8][4];
#pragma unroll
        for (int mt = 0; mt < kDqMTiles; ++mt) zero(dq[mt]);
#pragma unroll kDqUnroll
        for (int kk = 0; kk < kBlockN / 16; ++kk) {
          uint32_t af[kDqMTiles][4];
#pragma unroll
          for (int mt = 0; mt < kDqMTiles; ++mt)
            ldmatrix_x4_trans(af[mt], smem_addr(ds_s + (kk * 16 + a_key) * kPadM + qrow0 + mt * 16 + a_q));
#pragma unroll
          for (int pp = 0; pp < kDqChunk / 16; ++pp) {
            uint32_t bf[4];
            ldmatrix_x4_trans(bf, smem_addr(k_s + (kk * 16 + b_row) * kPadD + c0 + pp * 16 + b_col));
            const uint32_t b0[2] = {bf[0], bf[1]}, b1[2] = {bf[2], bf[3]};
#pragma unroll
            for (int mt = 0; mt < kDqMTiles; ++mt) {
              mma_16816<kBf16>(dq[mt][2 * pp], af[mt], b0);
              mma_16816<kBf16>(dq[mt][2 * pp + 1], af[mt], b1);
            }
          }
        }
#pragma unroll
        for (int mt = 0; mt < kDqMTiles; ++mt) {
          const int row = m0 + qrow0 + mt * 16 + g;
          float* dst = dq_accum + (ws_row + mt * 16) * kD;
#pragma unroll
          for (int j = 0; j < kDqChunk / 8; ++j) {
            const int col = c0 + j * 8 + 2 * t4;
            if (row < sq.y) atomicAdd(reinterpret_cast<float2*>(dst + col), make_float2(dq[mt][j][0], dq[mt][j][1]));
            if (row + 8 < sq.y)
              atomicAdd(reinterpret_cast<float2*>(dst + 8 * kD + col), make_float2(dq[mt][j][2], dq[mt][j][3]));
          }
        }
      }
    }
#if !PREFETCH_AFTER_SYNC
    __syncthreads();  // stage and dS^T are overwritten next step
#endif
  }
  cp_async_wait<0>();

  // dK, dV (batch, seqlen_k, kv_heads, D) contiguous; dK carries the softmax scale of s = scale * q.k
  const int key = n0 + key_row0 + g;
  const int64_t tok = cu_k == nullptr ? int64_t(b) * seqlen_k + key : int64_t(sk.x) + key;
  T* dk_row = dk + (tok * kv_heads + hk) * kD + dcol0;
  T* dv_row = dv + (tok * kv_heads + hk) * kD + dcol0;
  const int64_t row8 = int64_t(8) * kv_heads * kD;
#pragma unroll
  for (int j = 0; j < kDw / 8; ++j) {
    const int col = j * 8 + 2 * t4;
    if (key < sk.y) {
      *reinterpret_cast<uint32_t*>(dk_row + col) = Traits::pack2(dk_acc[j][0] * softmax_scale, dk_acc[j][1] * softmax_scale);
      *reinterpret_cast<uint32_t*>(dv_row + col) = Traits::pack2(dv_acc[j][0], dv_acc[j][1]);
    }
    if (key + 8 < sk.y) {
      *reinterpret_cast<uint32_t*>(dk_row + row8 + col) = Traits::pack2(dk_acc[j][2] * softmax_scale, dk_acc[j][3] * softmax_scale);
      *reinterpret_cast<uint32_t*>(dv_row + row8 + col) = Traits::pack2(dv_acc[j][2], dv_acc[j][3]);
    }
  }
}

#if BWD_TILED
#include "bwd_tiled.cuh"
#endif
#if BWD_WGMMA
#include "bwd_hopper.cuh"
#endif

#define HFP_DKDV_PARAMS                                                                                      \
  const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v, const T *__restrict__ dout,      \
      const float *__restrict__ lse2_ws, const float *__restrict__ dvec_ws, float *__restrict__ dq_accum,    \
      T *__restrict__ dk, T *__restrict__ dv, const int *__restrict__ cu_q, const int *__restrict__ cu_k,    \
      int64_t q_sb, int64_t q_ss, int64_t q_sh, int64_t k_sb, int64_t k_ss, int64_t k_sh, int64_t v_sb,      \
      int64_t v_ss, int64_t v_sh, int64_t do_sb, int64_t do_ss, int64_t do_sh, int seqlen_q, int seqlen_k,   \
      int heads, int kv_heads, int rows_pad, float softmax_scale, float scale_log2, float softcap_in,        \
      float softcap_out, int left, int right
#define HFP_DKDV_ARGS                                                                                       \
  q, k, v, dout, lse2_ws, dvec_ws, dq_accum, dk, dv, cu_q, cu_k, q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb,   \
      v_ss, v_sh, do_sb, do_ss, do_sh, seqlen_q, seqlen_k, heads, kv_heads, rows_pad, softmax_scale,         \
      scale_log2, softcap_in, softcap_out, left, right

// grid (ceil(max_seqlen_k / kBlockN), kv_heads, batch), kThreads threads.
extern "C" __global__ void __launch_bounds__(kThreads, MIN_BLOCKS) bwd_dkdv_dq_atomic(HFP_DKDV_PARAMS) {
#if BWD_WGMMA
  dkdv_wgmma_body(HFP_DKDV_ARGS);  // all five GEMMs on warpgroup MMA (cuda/bwd_hopper.cuh)
#elif BWD_TILED
  dkdv_tiled_body(HFP_DKDV_ARGS);  // 2-D warp tiling of all five GEMMs (cuda/bwd_tiled.cuh)
#else
  dkdv_body<true>(HFP_DKDV_ARGS);
#endif
}
extern "C" __global__ void __launch_bounds__(kThreads, MIN_BLOCKS) bwd_dkdv(HFP_DKDV_PARAMS) {
  dkdv_body<false>(HFP_DKDV_ARGS);
}

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

// --------------------------------------------------------------------------------- dQ pass (deterministic)
// grid (ceil(max_seqlen_q / kQBlockM), heads, batch), kQThreads threads. dq (tokens, heads, D) contiguous.
extern "C" __global__ void __launch_bounds__(kQThreads, 1) bwd_dq(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
    const float* __restrict__ lse2_ws, const float* __restrict__ dvec_ws, T* __restrict__ dq,
    const int* __restrict__ cu_q, const int* __restrict__ cu_k, int64_t q_sb, int64_t q_ss, int64_t q_sh,
    int64_t k_sb, int64_t k_ss, int64_t k_sh, int64_t v_sb, int64_t v_ss, int64_t v_sh, int64_t do_sb,
    int64_t do_ss, int64_t do_sh, int seqlen_q, int seqlen_k, int heads, int kv_heads, int rows_pad,
    float softmax_scale, float scale_log2, float softcap_in, float softcap_out, int left, int right) {
  extern __shared__ __align__(16) unsigned char dq_smem_raw[];
  T* q_s = reinterpret_cast<T*>(dq_smem_raw);  // (kQBlockM, kPadD)
  T* do_s = q_s + kQBlockM * kPadD;          // (kQBlockM, kPadD)
  T* k_s = do_s + kQBlockM * kPadD;          // (2 stages, kQBlockN, kPadD)
  T* v_s = k_s + 2 * kQBlockN * kPadD;       // (2 stages, kQBlockN, kPadD)

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int m_block = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int2 sq = sequence(cu_q, b, seqlen_q), sk = sequence(cu_k, b, seqlen_k);
  const int m0 = m_block * kQBlockM;
  if (m0 >= sq.y) return;
  const Visibility vis{sq.y, sk.y, sk.y - sq.y, left, right};
  const Scores sc{scale_log2, softcap_in, softcap_out};
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
        float x = exp2f(sc.logit(p[j][r], &dt) - (r < 2 ? lse_lo : lse_hi));
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
    acc_to_a<kQBlockN>(dsa, ds);
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
