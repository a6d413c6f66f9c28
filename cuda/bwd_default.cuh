// hf_flashpatch backward: the default body of bwd_dkdv / bwd_dkdv_dq_atomic (mma.sync, every head dim):
// one block of NUM_WARPS warps per (K/V tile, kv head, batch), 16 keys per warp as MMA rows, dK/dV in
// registers for the whole block; with kAccumDq, dS^T through shared memory and dQ added to the fp32
// workspace with atomics. Layout as in bwd.cu.
#pragma once
#include "bwd_common.cuh"

namespace hfp {
namespace bwd {

// The shared memory dkdv_body carves up: K, V, two stages of Q and dO, dS^T, two stages of lse2 and D.
constexpr int kDefaultSharedBytes = (2 * kBlockN * kPadD + 4 * kBlockM * kPadD + kBlockN * kPadM) * 2 + 4 * kBlockM * 4;

template <bool kAccumDq>
__device__ __forceinline__ void dkdv_body(HFP_DKDV_PARAMS) {
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
  // heavy_first is 1 for this body (no register room for the choice: see dkdv_block)
  const DkdvBlock blk = dkdv_block(1);
  const int n_block = blk.n_block, hk = blk.kv_head, b = blk.batch;
  const int2 sq = sequence(cu_q, b, seqlen_q, total_q), sk = sequence(cu_k, b, seqlen_k, total_k);
  const int n0 = n_block * kBlockN;
  if (n0 >= sk.y) return;
  const Visibility vis = visibility(sq.y, sk.y, left, right);
  const ScoreScale sc{scale_log2, softcap_pre, softcap_log2};
  const int group = heads / kv_heads;
  const int bw = cu_q == nullptr ? b : 0;  // workspace batch index (varlen packs into one)

  const T* k_tile = k + b * k_sb + int64_t(sk.x + n0) * k_ss + hk * k_sh;
  const T* v_tile = v + b * v_sb + int64_t(sk.x + n0) * v_ss + hk * v_sh;
  load_tile<kBlockN, kThreads>(k_s, k_tile, k_ss, sk.y - n0, tid);
  load_tile<kBlockN, kThreads>(v_s, v_tile, v_ss, sk.y - n0, tid);
  cp_async_commit();

  const QuerySteps qs_range = query_steps<kBlockM>(vis, n0, min(n0 + kBlockN, sk.y), group);
  const int m_first = qs_range.m_first, m_count = qs_range.m_count, steps = qs_range.steps;

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
    if (step + 1 < steps) load_q_side(step + 1, stage ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

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
        float x = exp2f(sc.logit2<HAS_SOFTCAP != 0>(p[j][r], dt) - lses[col]);
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
      pack_a_fragments<kBf16, kBlockM>(pa, p);
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
    pack_a_fragments<kBf16, kBlockM>(dsa, ds);
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
      const int64_t ws_row = (int64_t(bw) * heads + h) * rows_pad + sq.x + m0 + qrow0 + g;
#pragma unroll 1
      for (int c0 = qcol0; c0 < qcol0 + kDqCols; c0 += kDqChunk) {
        float dq[kDqMTiles][kDqChunk / 8][4];
#pragma unroll
        for (int mt = 0; mt < kDqMTiles; ++mt) zero(dq[mt]);
        warp_gemm<kDqMTiles, kDqChunk / 8, kBlockN / 16, true, false, kDqUnroll>(dq, ds_s + qrow0, kPadM, k_s + c0,
                                                                              kPadD, lane);
#pragma unroll
        for (int mt = 0; mt < kDqMTiles; ++mt) {
          const int row = m0 + qrow0 + mt * 16 + g;
          float* dst = dq_accum + (ws_row + mt * 16) * kD;
#pragma unroll
          for (int j = 0; j < kDqChunk / 8; ++j) {
            const int col = c0 + j * 8 + 2 * t4;
            if (row < sq.y) red_add_f32x2(dst + col, dq[mt][j][0], dq[mt][j][1]);
            if (row + 8 < sq.y) red_add_f32x2(dst + 8 * kD + col, dq[mt][j][2], dq[mt][j][3]);
          }
        }
      }
    }
    __syncthreads();  // stage and dS^T are overwritten next step
  }
  cp_async_wait<0>();

  // dK, dV (batch, seqlen_k, kv_heads, D) contiguous; dK carries the softmax scale of s = scale * q.k
  const int key = n0 + key_row0 + g;
  const int64_t tok = cu_k == nullptr ? int64_t(b) * seqlen_k + key : int64_t(sk.x) + key;
  store_dkdv_rows(dk, dv, dk_acc, dv_acc, key, sk.y, tok, kv_heads, hk, dcol0, t4, int64_t(8) * kv_heads * kD,
                  softmax_scale);
}

}  // namespace bwd
}  // namespace hfp
