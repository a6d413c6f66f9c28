// hf_flashpatch backward: the compile-time configuration (macros) and the helpers
// every backward body shares (tile loads, mma.sync warp GEMMs, visibility, score transform, sequence
// geometry). Layout as in bwd.cu: q/dO (batch, seqlen_q, heads, head_dim), k/v (batch, seqlen_k,
// kv_heads, head_dim), varlen packed along the token dim.
#pragma once
#include "primitives.cuh"
#include "score_scale.cuh"
#include "visibility.cuh"

// The dK/dV kernels' parameters (hf_flashpatch/kernels/sources.py reads the launch's letters from here)
// and the same names as arguments: every dK/dV body (bwd_default.cuh, bwd_tiled.cuh, bwd_hopper.cuh)
// takes this one list.
#define HFP_DKDV_PARAMS                                                                                      \
  const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v, const T *__restrict__ dout,      \
      const float *__restrict__ lse2_ws, const float *__restrict__ dvec_ws, float *__restrict__ dq_accum,    \
      T *__restrict__ dk, T *__restrict__ dv, const int *__restrict__ cu_q, const int *__restrict__ cu_k,    \
      int64_t q_sb, int64_t q_ss, int64_t q_sh, int64_t k_sb, int64_t k_ss, int64_t k_sh, int64_t v_sb,      \
      int64_t v_ss, int64_t v_sh, int64_t do_sb, int64_t do_ss, int64_t do_sh, int seqlen_q, int seqlen_k,   \
      int heads, int kv_heads, int rows_pad, float softmax_scale, float scale_log2, float softcap_pre,       \
      float softcap_log2, int left, int right, int total_q, int total_k, int heavy_first
#define HFP_DKDV_ARGS                                                                                       \
  q, k, v, dout, lse2_ws, dvec_ws, dq_accum, dk, dv, cu_q, cu_k, q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb,   \
      v_ss, v_sh, do_sb, do_ss, do_sh, seqlen_q, seqlen_k, heads, kv_heads, rows_pad, softmax_scale,         \
      scale_log2, softcap_pre, softcap_log2, left, right, total_q, total_k, heavy_first

// Every build passes (BackwardConfig.build, hf_flashpatch/kernels/backward.py): HEAD_DIM, ELEM_BF16, HAS_SOFTCAP;
// bwd_dkdv's BLOCK_M (query rows per inner step), NUM_WARPS, D_SPLIT (warps sharing one 16-key row group, each
// owning HEAD_DIM / D_SPLIT of dK/dV), DQ_CHUNK (dQ columns per pass), DQ_WARP_ROWS (query rows per warp in its dQ
// product: 16 or 32), SS_UNROLL (unroll of the head-dim loop of K Q^T / V dO^T); bwd_dq's DQ_BLOCK_N (keys per
// inner step) and DQ_WARPS (16 query rows each); and with a body of its own, BWD_TILED (+ TILED_BLOCK_M,
// TILED_UNROLL) or BWD_WGMMA (+ BWD_WGMMA_BLOCK_M).
#if !defined(HEAD_DIM) || !defined(ELEM_BF16) || !defined(BLOCK_M) || !defined(DQ_WARP_ROWS)
#error "the backward's configuration comes from the build (hf_flashpatch/kernels/backward.py, BackwardConfig.build)"
#endif
#ifndef HEAD_DIM_V  // v / out / dout head dim (multi-head latent attention: 128 with HEAD_DIM 192); bwd_hopper.cuh only
#define HEAD_DIM_V HEAD_DIM
#endif
#ifndef BWD_TILED  // 1: bwd_dkdv_dq_atomic takes the 2-D warp-tiled body of bwd_tiled.cuh (d64/d128)
#define BWD_TILED 0
#endif
#ifndef BWD_WGMMA  // 1: bwd_dkdv_dq_atomic takes the Hopper wgmma body of bwd_hopper.cuh (sm_90a, d64/d128)
#define BWD_WGMMA 0
#endif

namespace hfp {
namespace bwd {

constexpr bool kBf16 = ELEM_BF16 != 0;
using Traits = ElemTraits<kBf16>;
using T = typename Traits::T;
constexpr int kD = HEAD_DIM;  // q / k / dq / dk
constexpr int kDv = HEAD_DIM_V;  // v / out / dout / dv
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
constexpr int kDqUnroll = 2;  // unroll of the key loop of bwd_dkdv's dQ product (bwd_default.cuh)
constexpr int kSsUnroll = SS_UNROLL;
constexpr int kRsUnroll = 8;  // unroll of the query loop of the dV / dK products

static_assert(kD % 16 == 0 && kDw % 16 == 0 && kDqCols % 16 == 0, "head dim tiling");
static_assert(kBlockM % kDqWarpRows == 0 && kDqRowWarps * kDqWarpRows <= kBlockM && kWarps % kDqRowWarps == 0 &&
                  kDqRowWarps * kDqColWarps == kWarps && kDqRowWarps * kDqWarpRows == kBlockM, "dQ warp tiling");
static_assert(kQBlockN % 16 == 0, "bwd_dq key tile");
static_assert(kDqCols % kDqChunk == 0 && kDqChunk % 16 == 0, "dQ column chunks must tile a warp's columns");


// The steps of a dK/dV block over key block [n0, n_end): query blocks of kStepM rows from m_first on, the
// m_count that see at least one of its keys, each once per query head of the GQA group.
struct QuerySteps {
  int m_first, m_count, steps;
};

template <int kStepM>
__device__ __forceinline__ QuerySteps query_steps(const Visibility& vis, int n0, int n_end, int group) {
  const int2 mr = vis.query_range(n0, n_end);
  const int m_first = max(mr.x, 0) / kStepM;
  const int m_count = mr.y > mr.x ? (mr.y - m_first * kStepM + kStepM - 1) / kStepM : 0;
  return {m_first, m_count, m_count * group};
}

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

// acc (MT*16 x NT*8) += A (MT*16 x K16*16) * B (K16*16 x NT*8), both operands in shared memory.
// kAKMajor: A stored [k][m] (a -> element (k0, m0), ldmatrix.trans), else [m][k] (a -> (m0, k0)).
// kBNMajor: B stored [n][k] (b -> (n0, k0), plain ldmatrix), else [k][n] (b -> (k0, n0), .trans).
template <int MT, int NT, int K16, bool kAKMajor, bool kBNMajor, int kUnroll>
__device__ __forceinline__ void warp_gemm(float (&acc)[MT][NT][4], const T* a, int lda, const T* b, int ldb,
                                          int lane) {
  const int a_r = kAKMajor ? (lane >> 4) * 8 + (lane & 7) : (lane & 7) + ((lane >> 3) & 1) * 8;
  const int a_c = kAKMajor ? ((lane >> 3) & 1) * 8 : (lane >> 4) * 8;
  const int b_r = kBNMajor ? (lane >> 4) * 8 + (lane & 7) : ((lane >> 3) & 1) * 8 + (lane & 7);
  const int b_c = kBNMajor ? ((lane >> 3) & 1) * 8 : (lane >> 4) * 8;
#pragma unroll kUnroll
  for (int kk = 0; kk < K16; ++kk) {
    uint32_t af[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if constexpr (kAKMajor)
        ldmatrix_x4_trans(af[mt], smem_addr(a + (kk * 16 + a_r) * lda + mt * 16 + a_c));
      else
        ldmatrix_x4(af[mt], smem_addr(a + (mt * 16 + a_r) * lda + kk * 16 + a_c));
    }
#pragma unroll
    for (int p = 0; p < NT / 2; ++p) {
      uint32_t bf[4];
      if constexpr (kBNMajor)
        ldmatrix_x4(bf, smem_addr(b + (p * 16 + b_r) * ldb + kk * 16 + b_c));
      else
        ldmatrix_x4_trans(bf, smem_addr(b + (kk * 16 + b_r) * ldb + p * 16 + b_c));
      const uint32_t b0[2] = {bf[0], bf[1]}, b1[2] = {bf[2], bf[3]};
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_16816<kBf16>(acc[mt][2 * p], af[mt], b0);
        mma_16816<kBf16>(acc[mt][2 * p + 1], af[mt], b1);
      }
    }
  }
}

// acc (16 x N) += A (16 x K: shared [m][k], stride lda elements) * B^T (B shared [n][k], stride ldb).
template <int N, int K>
__device__ __forceinline__ void gemm_ss_nt(float (&acc)[N / 8][4], const T* a, int lda, const T* b, int ldb,
                                           int lane) {
  warp_gemm<1, N / 8, K / 16, false, true, kSsUnroll>(reinterpret_cast<float(&)[1][N / 8][4]>(acc), a, lda, b, ldb,
                                                      lane);
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

// A warp's dK / dV rows of token `tok` and 8 keys on (fragments of kNt 8-column blocks from column c0) into the
// (tokens, kv_heads, kD) gradients; dK carries the softmax scale of s = scale * q.k; keys >= key_end are skipped.
template <int kNt>
__device__ __forceinline__ void store_dkdv_rows(T* dk, T* dv, const float (&dk_acc)[kNt][4],
                                                const float (&dv_acc)[kNt][4], int key, int key_end, int64_t tok,
                                                int kv_heads, int hk, int c0, int t4, int64_t row8,
                                                float softmax_scale) {
  T* dk_row = dk + (tok * kv_heads + hk) * kD + c0;
  T* dv_row = dv + (tok * kv_heads + hk) * kD + c0;
#pragma unroll
  for (int j = 0; j < kNt; ++j) {
    const int col = j * 8 + 2 * t4;
    if (key < key_end) {
      *reinterpret_cast<uint32_t*>(dk_row + col) =
          Traits::pack2(dk_acc[j][0] * softmax_scale, dk_acc[j][1] * softmax_scale);
      *reinterpret_cast<uint32_t*>(dv_row + col) = Traits::pack2(dv_acc[j][0], dv_acc[j][1]);
    }
    if (key + 8 < key_end) {
      *reinterpret_cast<uint32_t*>(dk_row + row8 + col) =
          Traits::pack2(dk_acc[j][2] * softmax_scale, dk_acc[j][3] * softmax_scale);
      *reinterpret_cast<uint32_t*>(dv_row + row8 + col) = Traits::pack2(dv_acc[j][2], dv_acc[j][3]);
    }
  }
}

template <int N>
__device__ __forceinline__ void zero(float (&acc)[N][4]) {
#pragma unroll
  for (int j = 0; j < N; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
}

// Order of the dK/dV blocks, chosen per launch (hf_flashpatch/kernels/backward.py, dkdv_grid). The hardware hands
// blocks out x fastest. heavy_first = 1: grid (kv heads, key blocks, batch), so block 0 of every KV head of a
// sequence starts first, then block 1, and so on; key block n is seen by the queries from about n on (causal,
// bottom-right) or by a constant number (window), so that is heaviest-first order. With few blocks per SM (one
// 4k-8k sequence, 8 KV heads: 256-512 blocks on 132 SMs) the long blocks then no longer start in the last wave.
// heavy_first = 0: grid (key blocks, kv heads, batch), all blocks of one head together; with many
// waves the tail is negligible and this keeps one head's Q / dO and dQ workspace in L2 for the blocks running at
// once (notes/backward.md has both orders' measurements). Coordinates come straight from blockIdx
// (computing them with a division by kv_heads cost the tiled d128 build a 12-byte spill). Only the Hopper body takes
// the choice; the mma.sync bodies always run heaviest first (the select cost the d256 build an 8-byte spill), and
// dkdv_grid launches them so.
struct DkdvBlock {
  int n_block, kv_head, batch;
};
__device__ __forceinline__ DkdvBlock dkdv_block(int heavy_first) {
  return heavy_first ? DkdvBlock{int(blockIdx.y), int(blockIdx.x), int(blockIdx.z)}
                     : DkdvBlock{int(blockIdx.x), int(blockIdx.y), int(blockIdx.z)};
}

// Sequence geometry of batch entry b: start token and length (varlen when cu != nullptr).
__device__ __forceinline__ int2 sequence(const int* cu, int b, int fixed_len, int total) {
  if (cu == nullptr) return make_int2(0, fixed_len);
  return packed_span(cu, b, total);  // varlen: clamped into the tensor's total rows (primitives.cuh)
}

}  // namespace bwd
}  // namespace hfp
