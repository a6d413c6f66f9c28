// hf_flashpatch: the "tiled" body of bwd_dkdv_dq_atomic (built with BWD_TILED=1), FA2's warp layout.
//
// Layout as in bwd.cu: q/dO (batch, seqlen_q, heads, head_dim), k/v/dk/dv (batch, seqlen_k, kv_heads,
// head_dim); varlen packs sequences along the token dim. One block of 8 warps per (128-key tile, KV head,
// batch) loops over the group's query heads and the visible kTBlockM-query tiles, as the default body does.
//
// Why a second body: the default gives every warp 16 keys and the whole query tile, so each warp re-reads
// all of Q/dO from shared memory (0.60 ldmatrix per MMA). Here every one of the five GEMMs is tiled 2-D over
// the 8 warps and P^T / dS^T go through shared memory once per step, which brings that to ~0.45:
//   S^T  = K Q^T   (128 x M)  4 x 2 warps, 32 keys x M/2 queries each (in 32-query chunks)
//   dP^T = V dO^T  (128 x M)  same tiling; P^T, dS^T = P^T (dP^T - D) computed in one pass and stored
//   dV  += P^T dO  (128 x D)  4 x 2 warps, 32 keys x D/2 columns each (accumulated over the whole block)
//   dK  += dS^T Q  (128 x D)  same tiling
//   dQ   = dS K    (M x D)    2 x 4 warps, M/2 queries x D/4 columns each, added to the fp32 workspace
// Two barriers per step: (A) the step's Q/dO stage has landed and every warp is done with the previous
// step (so the other stage, P^T and dS^T may be overwritten; the next prefetch is issued after it), and
// (B) P^T / dS^T are complete. Softcap needs no extra registers: S^T and dP^T are both live when P^T and
// dS^T are formed, so 1 - tanh^2 is used where it is computed.
#pragma once


namespace hfp {
namespace bwd {

constexpr int kTBlockM = TILED_BLOCK_M;
constexpr int kTUnroll = TILED_UNROLL;
constexpr int kTBlockN = 128;  // keys per block (as the default build: 8 warps x 16)
constexpr int kTPadM = kTBlockM + 8;  // P^T / dS^T shared row stride: +16 B, conflict-free ldmatrix
// warp grids (rows x columns of warps) of the three output shapes
constexpr int kSKeyWarps = 4, kSQWarps = 2;     // S^T, dP^T (keys x queries)
constexpr int kKvKeyWarps = 4, kKvColWarps = 2; // dK, dV (keys x head dim)
constexpr int kQQWarps = 2, kQColWarps = 4;     // dQ (queries x head dim)
// S^T / dP^T: a warp's kTBlockM / 2 queries are done kSChunk at a time (32: the two 32 x 32 fp32 tiles
// next to dK/dV's 128 registers at d128; a 128-query step then costs no more registers than a 64-query one)
constexpr int kSChunk = 32;
constexpr int kSChunks = kTBlockM / kSQWarps / kSChunk;
constexpr int kSMt = kTBlockN / kSKeyWarps / 16, kSNt = kSChunk / 8;
constexpr int kKvMt = kTBlockN / kKvKeyWarps / 16, kKvNt = kD / kKvColWarps / 8;
constexpr int kQMt = kTBlockM / kQQWarps / 16, kQNt = kD / kQColWarps / 8;
static_assert(kSKeyWarps * kSQWarps == kWarps && kKvKeyWarps * kKvColWarps == kWarps &&
                  kQQWarps * kQColWarps == kWarps, "tiled body: 8 warps");
static_assert(kSNt % 2 == 0 && kKvNt % 2 == 0 && kQNt % 2 == 0 && kSMt >= 1 && kQMt >= 1,
              "tiled body: warp tiles must be whole 16 x 16 ldmatrix tiles");
static_assert(2 * kTBlockM <= kThreads, "tiled body: lse/D tile load");
static_assert(kSChunks * kSChunk * kSQWarps == kTBlockM, "tiled body: query chunks must tile the step");

// The shared memory dkdv_tiled_body carves up: K, V, two stages of Q and dO, P^T and dS^T, two stages of lse2 and D.
constexpr int kTiledSharedBytes = (2 * kTBlockN * kPadD + 4 * kTBlockM * kPadD + 2 * kTBlockN * kTPadM) * 2 +
                                  4 * kTBlockM * 4;

__device__ __forceinline__ void dkdv_tiled_body(HFP_DKDV_PARAMS) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* k_s = reinterpret_cast<T*>(smem_raw);             // (kTBlockN, kPadD)
  T* v_s = k_s + kTBlockN * kPadD;                       // (kTBlockN, kPadD)
  T* q_s = v_s + kTBlockN * kPadD;                       // (2 stages, kTBlockM, kPadD)
  T* do_s = q_s + 2 * kTBlockM * kPadD;                  // (2 stages, kTBlockM, kPadD)
  T* p_s = do_s + 2 * kTBlockM * kPadD;                  // (kTBlockN, kTPadM): P^T, keys x queries
  T* ds_s = p_s + kTBlockN * kTPadM;                     // (kTBlockN, kTPadM): dS^T
  float* lse_s = reinterpret_cast<float*>(ds_s + kTBlockN * kTPadM);  // (2, kTBlockM)
  float* dvec_s = lse_s + 2 * kTBlockM;                               // (2, kTBlockM)

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  // heavy_first is 1 for this body (no register room for the choice: see dkdv_block)
  const DkdvBlock blk = dkdv_block(1);
  const int n_block = blk.n_block, hk = blk.kv_head, b = blk.batch;
  const int2 sq = sequence(cu_q, b, seqlen_q, total_q), sk = sequence(cu_k, b, seqlen_k, total_k);
  const int n0 = n_block * kTBlockN;
  if (n0 >= sk.y) return;
  const Visibility vis = visibility(sq.y, sk.y, left, right);
  const ScoreScale sc{scale_log2, softcap_pre, softcap_log2};
  const int group = heads / kv_heads;
  const int bw = cu_q == nullptr ? b : 0;  // workspace batch index (varlen packs into one)

  load_tile<kTBlockN, kThreads>(k_s, k + b * k_sb + int64_t(sk.x + n0) * k_ss + hk * k_sh, k_ss, sk.y - n0, tid);
  load_tile<kTBlockN, kThreads>(v_s, v + b * v_sb + int64_t(sk.x + n0) * v_ss + hk * v_sh, v_ss, sk.y - n0, tid);
  cp_async_commit();

  const QuerySteps qs_range = query_steps<kTBlockM>(vis, n0, min(n0 + kTBlockN, sk.y), group);
  const int m_first = qs_range.m_first, m_count = qs_range.m_count, steps = qs_range.steps;

  auto load_q_side = [&](int step, int stage) {
    const int h = hk * group + step / m_count;
    const int m0 = (m_first + step % m_count) * kTBlockM;
    load_tile<kTBlockM, kThreads>(q_s + stage * kTBlockM * kPadD, q + b * q_sb + int64_t(sq.x + m0) * q_ss + h * q_sh,
                                  q_ss, sq.y - m0, tid);
    load_tile<kTBlockM, kThreads>(do_s + stage * kTBlockM * kPadD,
                                  dout + b * do_sb + int64_t(sq.x + m0) * do_ss + h * do_sh, do_ss, sq.y - m0, tid);
    const int64_t ws = (int64_t(bw) * heads + h) * rows_pad + sq.x + m0;
    if (tid < kTBlockM) {
      cp_async_4(smem_addr(lse_s + stage * kTBlockM + tid), lse2_ws + ws + tid);
    } else if (tid < 2 * kTBlockM) {
      cp_async_4(smem_addr(dvec_s + stage * kTBlockM + tid - kTBlockM), dvec_ws + ws + tid - kTBlockM);
    }
  };

  // this warp's tiles: S^T / dP^T (keys s_key0.., queries s_q0..), dK/dV (keys kv_key0.., columns kv_c0..),
  // dQ (queries dq_q0.., columns dq_c0..)
  const int s_key0 = (warp / kSQWarps) * (kSMt * 16), s_qw0 = (warp % kSQWarps) * (kSChunks * kSChunk);
  const int kv_key0 = (warp / kKvColWarps) * (kKvMt * 16), kv_c0 = (warp % kKvColWarps) * (kKvNt * 8);
  const int dq_q0 = (warp / kQColWarps) * (kQMt * 16), dq_c0 = (warp % kQColWarps) * (kQNt * 8);
  float dv_acc[kKvMt][kKvNt][4], dk_acc[kKvMt][kKvNt][4];
  zero_fragments(dv_acc);
  zero_fragments(dk_acc);

  if (steps > 0) load_q_side(0, 0);
  cp_async_commit();

  for (int step = 0; step < steps; ++step) {
    const int stage = step & 1;
    cp_async_wait<0>();
    __syncthreads();  // (A)
    if (step + 1 < steps) load_q_side(step + 1, stage ^ 1);
    cp_async_commit();

    const int h = hk * group + step / m_count;
    const int m0 = (m_first + step % m_count) * kTBlockM;
    const T* qs = q_s + stage * kTBlockM * kPadD;
    const T* dos = do_s + stage * kTBlockM * kPadD;
    const float* lses = lse_s + stage * kTBlockM;
    const float* dvs = dvec_s + stage * kTBlockM;

    const bool full = vis.tile_all_visible(m0, m0 + kTBlockM, n0, n0 + kTBlockN);
#pragma unroll 1
    for (int chunk = 0; chunk < kSChunks; ++chunk) {
      // S^T = K Q^T and dP^T = V dO^T for this warp's (keys x queries) tile, kSChunk queries at a time
      const int s_q0 = s_qw0 + chunk * kSChunk;
      float s[kSMt][kSNt][4], dp[kSMt][kSNt][4];
      zero_fragments(s);
      warp_gemm<kSMt, kSNt, kD / 16, false, true, kTUnroll>(s, k_s + s_key0 * kPadD, kPadD, qs + s_q0 * kPadD, kPadD,
                                                            lane);
      zero_fragments(dp);
      warp_gemm<kSMt, kSNt, kD / 16, false, true, kTUnroll>(dp, v_s + s_key0 * kPadD, kPadD, dos + s_q0 * kPadD,
                                                            kPadD, lane);
#pragma unroll
      for (int mt = 0; mt < kSMt; ++mt) {
#pragma unroll
        for (int j = 0; j < kSNt; ++j) {
          float pv[4], dsv[4];
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const int col = s_q0 + j * 8 + 2 * t4 + (r & 1);          // query within the tile
            const int key = s_key0 + mt * 16 + g + (r >> 1) * 8;       // key within the block
            float dt = 1.f;
            float x = exp2f(sc.logit2<HAS_SOFTCAP != 0>(s[mt][j][r], dt) - lses[col]);
            if (!full && !vis.visible(m0 + col, n0 + key)) x = 0.f;
            pv[r] = x;
            dsv[r] = x * (dp[mt][j][r] - dvs[col]) * dt;
          }
          const int row = s_key0 + mt * 16 + g, col = s_q0 + j * 8 + 2 * t4;
          *reinterpret_cast<uint32_t*>(p_s + row * kTPadM + col) = Traits::pack2(pv[0], pv[1]);
          *reinterpret_cast<uint32_t*>(p_s + (row + 8) * kTPadM + col) = Traits::pack2(pv[2], pv[3]);
          *reinterpret_cast<uint32_t*>(ds_s + row * kTPadM + col) = Traits::pack2(dsv[0], dsv[1]);
          *reinterpret_cast<uint32_t*>(ds_s + (row + 8) * kTPadM + col) = Traits::pack2(dsv[2], dsv[3]);
        }
      }
    }
    __syncthreads();  // (B) P^T and dS^T complete

    // dV += P^T dO, dK += dS^T Q (keys x columns; k runs over the tile's queries)
    warp_gemm<kKvMt, kKvNt, kTBlockM / 16, false, false, kTUnroll>(dv_acc, p_s + kv_key0 * kTPadM, kTPadM,
                                                                    dos + kv_c0, kPadD, lane);
    warp_gemm<kKvMt, kKvNt, kTBlockM / 16, false, false, kTUnroll>(dk_acc, ds_s + kv_key0 * kTPadM, kTPadM,
                                                                    qs + kv_c0, kPadD, lane);
    // dQ (queries x columns) = dS K, A = dS read from dS^T (k-major); added to the fp32 workspace
    {
      float dq[kQMt][kQNt][4];
      zero_fragments(dq);
      warp_gemm<kQMt, kQNt, kTBlockN / 16, true, false, kTUnroll>(dq, ds_s + dq_q0, kTPadM, k_s + dq_c0, kPadD, lane);
      const int64_t ws_row = (int64_t(bw) * heads + h) * rows_pad + sq.x + m0 + dq_q0 + g;
#pragma unroll
      for (int mt = 0; mt < kQMt; ++mt) {
        const int row = m0 + dq_q0 + mt * 16 + g;
        float* dst = dq_accum + (ws_row + mt * 16) * kD + dq_c0;
#pragma unroll
        for (int j = 0; j < kQNt; ++j) {
          const int col = j * 8 + 2 * t4;
          if (row < sq.y) red_add_f32x2(dst + col, dq[mt][j][0], dq[mt][j][1]);
          if (row + 8 < sq.y) red_add_f32x2(dst + 8 * kD + col, dq[mt][j][2], dq[mt][j][3]);
        }
      }
    }
  }
  cp_async_wait<0>();

  // dK, dV (batch, seqlen_k, kv_heads, D) contiguous; dK carries the softmax scale of s = scale * q.k
  const int64_t row8 = int64_t(8) * kv_heads * kD;
#pragma unroll
  for (int mt = 0; mt < kKvMt; ++mt) {
    const int key = n0 + kv_key0 + mt * 16 + g;
    const int64_t tok = cu_k == nullptr ? int64_t(b) * seqlen_k + key : int64_t(sk.x) + key;
    store_dkdv_rows(dk, dv, dk_acc[mt], dv_acc[mt], key, sk.y, tok, kv_heads, hk, kv_c0, t4, row8, softmax_scale);
  }
}

}  // namespace bwd
}  // namespace hfp
