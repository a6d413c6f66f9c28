// hf_flashpatch: FlashAttention-2 style forward kernel (mma.sync m16n8k16, ldmatrix, cp.async).
//
// Layout: q (B, S_q, H, D), k/v (B, S_k, H_kv, D) with arbitrary batch/seq/head strides (the head
// dim is contiguous); varlen packs sequences along the token axis and passes cu_seqlens. out has
// q's layout (strides passed), lse is (B, H, S_q) or, varlen, (H, T_q), fp32 natural log.
//
// One CTA computes BLOCK_M packed rows of one (kv head, batch) pair: packed row p is query
// position p / group of query head kv_head * group + p % group, so every K/V tile is loaded once
// for the whole GQA group. Warp w owns rows [16 * MT * w, 16 * MT * (w + 1)) of the tile.
//
// Per key tile (walked from the last visible tile down, so the masked diagonal tiles come first):
//   S = Q K^T (fp32 accumulators) -> optional tanh soft-cap -> mask (only on boundary tiles)
//   -> online softmax in base 2 (the exp2 multiplier: score_scale.cuh) -> P converted in registers to the
//   A operand of O += P V (no shared-memory round trip).
// K/V tiles stream through a KV_STAGES-deep cp.async ring; the next tile's copy overlaps this one's math.
//
// Compile-time configuration (-D, produced by ForwardConfig in hf_flashpatch/kernels/forward.py):
//   HEAD_DIM, BLOCK_M, BLOCK_N, NUM_WARPS, KV_STAGES, Q_IN_REGS, ELEM_BF16,
//   HAS_MASK
//   (HAS_MASK = 0 compiles out causal / sliding-window masking; the key-length bound is always kept).
#include "fwd_gemm.cuh"
#include "fwd_geometry.cuh"
#include "fwd_softmax.cuh"
#include "fwd_tile_io.cuh"
#include "primitives.cuh"
using namespace hfp;
using namespace hfp::fwd;

namespace {

using Layout = hfp::fwd::TileLayout<HEAD_DIM>;

constexpr int kThreads = NUM_WARPS * 32;
constexpr int kMT = BLOCK_M / (16 * NUM_WARPS);  // 16-row m-tiles per warp
constexpr int kNT = BLOCK_N / 8;                 // 8-key n-tiles of S per tile
constexpr int kOT = HEAD_DIM / 8;                // 8-column n-tiles of O
[[maybe_unused]] constexpr int kKSteps = HEAD_DIM / 16;          // k-steps of Q K^T (the Q fragments kept in registers)
constexpr bool kBf16 = ELEM_BF16 != 0;
constexpr bool kWindowed = HAS_MASK != 0;  // causal / sliding-window masking compiled in
static_assert(BLOCK_M % (16 * NUM_WARPS) == 0 && kMT >= 1, "BLOCK_M must be a multiple of 16 * NUM_WARPS");
static_assert(BLOCK_N % 16 == 0 && HEAD_DIM % 16 == 0, "BLOCK_N and HEAD_DIM must be multiples of 16");
static_assert(KV_STAGES >= 2, "the K/V ring needs at least two stages");

constexpr int kQTileElems = BLOCK_M * Layout::kRowStride;
constexpr int kKVTileElems = BLOCK_N * Layout::kRowStride;

}  // namespace

// The dynamic shared memory the kernel carves up below (Q, then the K and V rings), read by the launch from
// the compiled module (hf_flashpatch/kernels/build.py, Kernel.shared_bytes).
extern "C" __constant__ int hfp_attention_forward_shared_bytes = (kQTileElems + 2 * KV_STAGES * kKVTileElems) * 2;

extern "C" __global__ void __launch_bounds__(kThreads, 1)
    hfp_attention_forward(const __grid_constant__ hfp::fwd::FwdParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Elem* smem_q = reinterpret_cast<Elem*>(smem_raw);  // (BLOCK_M, row stride); later the output staging tile
  Elem* smem_k = smem_q + kQTileElems;                // (KV_STAGES, BLOCK_N, row stride)
  Elem* smem_v = smem_k + KV_STAGES * kKVTileElems;   // (KV_STAGES, BLOCK_N, row stride)

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;

  // ---- the tile's rows and the key tiles they see (varlen: token offsets from cu_seqlens)
  const QueryTile tile = query_tile<kWindowed, BLOCK_M, BLOCK_N>(p, block_work<kWindowed>());
  if (tile.empty()) return;
  const int seqlen_k = tile.span.seqlen_k, group = tile.group, packed_rows = tile.packed_rows, p0 = tile.p0;
  const int n_block_max = tile.keys.n_block_max, num_tiles = tile.keys.num_tiles;

  const int g = lane >> 2, t = lane & 3;
  const int warp_row0 = warp * 16 * kMT;

  // ---- prologue: Q and the first KV_STAGES - 1 key tiles in flight
  copy_packed_tile<true, HEAD_DIM, BLOCK_M, kThreads>(tile.q_rows, smem_q, p.q_seq_stride, p.q_head_stride, p0,
                                                      packed_rows, group, tid);
#pragma unroll
  for (int s = 0; s < KV_STAGES - 1; ++s) {
    if (s < num_tiles) {
      const int key0 = (n_block_max - 1 - s) * BLOCK_N;
      load_kv_tile<HEAD_DIM, BLOCK_N, kThreads>(smem_k + s * kKVTileElems, tile.k_rows,
                                                p.k_seq_stride, key0, seqlen_k, tid);
      load_kv_tile<HEAD_DIM, BLOCK_N, kThreads>(smem_v + s * kKVTileElems, tile.v_rows,
                                                p.v_seq_stride, key0, seqlen_k, tid);
    }
    cp_async_commit();  // one group per stage, empty or not, so the wait counts stay uniform
  }

  float acc_o[kMT][kOT][4];  // (MT, O n-tiles, C fragment) unnormalised output rows
  zero_fragments(acc_o);
  OnlineSoftmax<kMT> softmax;
  softmax.init();

#if Q_IN_REGS
  uint32_t q_frag[kMT][kKSteps][4];  // (MT, k-steps, A fragment): this warp's Q rows, loaded once
#endif

  for (int i = 0; i < num_tiles; ++i) {
    const int n_block = n_block_max - 1 - i;
    const int key0 = n_block * BLOCK_N;
    cp_async_wait<KV_STAGES - 2>();
    __syncthreads();  // tile i landed for every thread; every warp is done with tile i - 1's buffer
    {
      const int ahead = i + KV_STAGES - 1;
      if (ahead < num_tiles) {
        const int slot = ahead % KV_STAGES;
        const int ahead_key0 = (n_block_max - 1 - ahead) * BLOCK_N;
        // a fresh thread index: the thread's chunk addresses are recomputed per tile rather than kept live
        // across the loop (at 255 registers ptxas spilled them for sm_80 at d64)
        load_kv_tile<HEAD_DIM, BLOCK_N, kThreads>(smem_k + slot * kKVTileElems, tile.k_rows, p.k_seq_stride, ahead_key0,
                                                  seqlen_k, fresh_thread_index());
        load_kv_tile<HEAD_DIM, BLOCK_N, kThreads>(smem_v + slot * kKVTileElems, tile.v_rows, p.v_seq_stride, ahead_key0,
                                                  seqlen_k, fresh_thread_index());
      }
      cp_async_commit();
    }
    const Elem* tile_k = smem_k + (i % KV_STAGES) * kKVTileElems;
    const Elem* tile_v = smem_v + (i % KV_STAGES) * kKVTileElems;

#if Q_IN_REGS
    if (i == 0) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int ks = 0; ks < kKSteps; ++ks)
          load_a_frag<HEAD_DIM>(q_frag[mt][ks], smem_q, warp_row0 + mt * 16, ks * 16, lane);
    }
#endif

    // ---- S = Q K^T   (MT, NT, 4)
    float scores[kMT][kNT][4];
#if Q_IN_REGS
    gemm_qk_regs<kBf16, HEAD_DIM>(scores, q_frag, tile_k, lane);
#else
    gemm_qk_smem<kBf16, HEAD_DIM>(scores, smem_q, tile_k, warp_row0, lane);
#endif

    // ---- soft-cap, mask, online softmax
    if (p.scores.softcap_pre != 0.f) apply_softcap(scores, p.scores);
    if (key0 < tile.keys.mask_lo || key0 + BLOCK_N > tile.keys.mask_hi)
      apply_mask<kWindowed>(scores, key0 + 2 * t, p0 + warp_row0 + g, group, tile.shifts, seqlen_k);
    softmax.update(scores, acc_o, p.scores.exp2_mul());

    // ---- O += P V, P taken straight from the score accumulators
    gemm_pv<kBf16, HEAD_DIM>(acc_o, scores, tile_v, lane);
  }

  // ---- epilogue: normalise, LSE, stage the tile in shared memory, 16-byte coalesced stores
  float inv_sum[kMT][2], row_lse[kMT][2];
  softmax.finalize(inv_sum, row_lse, p.scores.exp2_mul());
  cp_async_wait<0>();
  __syncthreads();  // every warp is done reading Q / K / V shared memory
  Elem* smem_o = smem_q;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp_row0 + mt * 16 + h * 8 + g;
#pragma unroll
      for (int ot = 0; ot < kOT; ++ot) {
        const uint32_t packed2 =
            Traits::pack2(acc_o[mt][ot][2 * h] * inv_sum[mt][h], acc_o[mt][ot][2 * h + 1] * inv_sum[mt][h]);
        *reinterpret_cast<uint32_t*>(smem_o + row * Layout::kRowStride + ot * 8 + 2 * t) = packed2;
      }
      const int packed = p0 + row;
      if (t == 0 && packed < packed_rows) {
        const int pos = group == 1 ? packed : packed / group;
        const int head = tile.kv_head * group + (packed - pos * group);
        p.lse[tile.batch * p.lse_batch_stride + head * p.lse_head_stride + tile.span.q_token0 + pos] = row_lse[mt][h];
      }
    }
  __syncthreads();
  Elem* o_base = out_rows(p, tile);
  // The store walks chunks exactly as the Q load did; a fresh read of the thread index stops the
  // compiler from keeping the load's addresses alive (and spilled) across the key loop.
  copy_packed_tile<false, HEAD_DIM, BLOCK_M, kThreads>(o_base, smem_o, p.o_seq_stride, p.o_head_stride, p0,
                                                       packed_rows, group, fresh_thread_index());
}
