// hf_flashpatch: Hopper forward kernel (sm_90a): both GEMMs of a key tile on warpgroup MMA (wgmma).
//
// Same contract as cuda/fwd.cu (same arguments, layouts, masks, GQA packing, varlen, LSE):
// q (B, S_q, H, D), k/v (B, S_k, H_kv, D) with arbitrary batch/seq/head strides and a contiguous head
// dim; out like q (strides passed); lse (B, H, S_q) or, varlen, (H, T_q), fp32 natural log.
//
// One CTA computes BLOCK_M = 64 * NUM_WG packed rows (query positions x the query heads of one GQA
// group) of one (kv head, batch) pair; warpgroup w owns rows [64 w, 64 w + 64), its warp j rows
// 64 w + 16 j + [0, 16). Per key tile (walked from the last visible tile down):
//   S = Q K^T: wgmma m64 x BLOCK_N x k16, Q and K both from SW128 shared-memory tiles (K-major);
//   soft-cap, mask (boundary tiles only), online softmax in base 2: the accumulator layout is, per warp,
//   mma.sync's C layout, so fwd_softmax.cuh's code (MT = 1) applies unchanged;
//   O += P V: wgmma m64 x HEAD_DIM x k16 with P packed in registers (A operand) and V from its SW128
//   tile read MN-major (transposed by the tensor core, no ldmatrix.trans).
// K/V tiles stream through a KV_STAGES-deep cp.async ring written in the swizzled format; the next
// tile's copy overlaps this tile's math.
//
// Compile-time configuration (-D, from ForwardConfig in hf_flashpatch/kernels/forward.py):
//   HEAD_DIM (64 or 128), BLOCK_N (64 or 128), NUM_WG, KV_STAGES, ELEM_BF16, HAS_MASK.
#include "fwd_hopper_common.cuh"

namespace {
// Tiles in flight ahead of the one being consumed: every ring slot but the one being read.
constexpr int kThreads = kMathThreads;
constexpr int kLookahead = KV_STAGES - 1;
static_assert(kLookahead >= 1, "the ring needs a free slot to prefetch into");
}  // namespace

// The dynamic shared memory (read by the launch from the compiled module: Kernel.shared_bytes).
extern "C" __constant__ int hfp_attention_forward_sm90_shared_bytes = kSharedTilesBytes;

extern "C" __global__ void __launch_bounds__(kThreads, 1) hfp_attention_forward_sm90(const __grid_constant__ hfp::fwd::FwdParams p) {
  using namespace hfp;
  using namespace hfp::fwd;
  using namespace hfp::sm90;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const SharedTiles smem = shared_tiles(smem_raw);
  const uint32_t q_tile = smem.q_tile, k_ring = smem.k_ring, v_ring = smem.v_ring;

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int warpgroup = uniform_warpgroup(tid);  // = warp >> 2

  // ---- the tile's rows and the key tiles they see (fwd_geometry.cuh)
  const QueryTile tile = query_tile<kWindowed, kBlockM, BLOCK_N>(p);
  if (tile.empty()) return;
  const int seqlen_k = tile.span.seqlen_k, group = tile.group, packed_rows = tile.packed_rows, p0 = tile.p0;
  const int n_block_max = tile.keys.n_block_max, num_tiles = tile.keys.num_tiles;
  const Elem *q_base = tile.q_rows, *k_base = tile.k_rows, *v_base = tile.v_rows;

  const int g = lane >> 2, t = lane & 3;
  const int warp_row0 = warp * 16;  // = 64 * warpgroup + 16 * (warp % 4)
  const OperandDescriptors desc = operand_descriptors(smem, warpgroup);

  // ---- prologue: Q and the first kLookahead key tiles in flight
  for_each_packed_chunk<HEAD_DIM, kBlockM, kThreads>(
      tid, p0, packed_rows, group, [&](int row, int col, int pos, int head, bool valid) {
        const Elem* src = q_base + (valid ? pos * p.q_seq_stride + head * p.q_head_stride + col : 0);
        cp_async_16(q_tile + (col / 64) * (kBlockM * kSubTileRowBytes) + sw128_offset(row, (col % 64) / 8), src, valid);
      });
#pragma unroll
  for (int s = 0; s < kLookahead; ++s) {
    if (s < num_tiles) {
      const int key0 = (n_block_max - 1 - s) * BLOCK_N;
      load_kv_tile_sw128<kThreads>(k_ring + s * kKVBytes, k_base, p.k_seq_stride, key0, seqlen_k, tid);
      load_kv_tile_sw128<kThreads>(v_ring + s * kKVBytes, v_base, p.v_seq_stride, key0, seqlen_k, tid);
    }
    cp_async_commit();
  }

  float acc_o[1][kOT][4];  // (1, O column blocks, C fragment): unnormalised output rows
  zero_fragments(acc_o);
  float(&o_flat)[kOT * 4] = reinterpret_cast<float(&)[kOT * 4]>(acc_o);
  OnlineSoftmax<1> softmax;
  softmax.init();
  float scores[1][kNT][4];
  float(&s_flat)[kNT * 4] = reinterpret_cast<float(&)[kNT * 4]>(scores);
  uint32_t probs[BLOCK_N / 16][4];

  // Wait for tile i, then request tile i + kLookahead into its ring slot (free: the tile it held was
  // consumed by every warpgroup before the barrier). One commit group per tile, empty or not.
  auto advance_ring = [&](int i) {
    cp_async_wait<kLookahead - 1>();
    fence_proxy_async_shared();  // cp.async wrote through the generic proxy; wgmma reads through the async one
    __syncthreads();
    const int ahead = i + kLookahead;
    if (ahead < num_tiles) {
      const int slot = ahead % KV_STAGES;
      const int ahead_key0 = (n_block_max - 1 - ahead) * BLOCK_N;
      load_kv_tile_sw128<kThreads>(k_ring + slot * kKVBytes, k_base, p.k_seq_stride, ahead_key0, seqlen_k, tid);
      load_kv_tile_sw128<kThreads>(v_ring + slot * kKVBytes, v_base, p.v_seq_stride, ahead_key0, seqlen_k, tid);
    }
    cp_async_commit();
  };
  // Soft-cap and mask the scores of key tile i, then the first half of the online softmax.
  float correction[1][2];
  auto exponentiate_tile = [&](int i) -> bool {
    const int key0 = (n_block_max - 1 - i) * BLOCK_N;
    if (p.softcap_pre_scale != 0.f) apply_softcap(scores, p.softcap_pre_scale);
    if (key0 < tile.keys.mask_lo || key0 + BLOCK_N > tile.keys.mask_hi)
      apply_mask<kWindowed>(scores, key0 + 2 * t, p0 + warp_row0 + g, group, tile.shifts, seqlen_k);
    return softmax.exponentiate(scores, correction, p.scale_log2);
  };
  // A wgmma that reads P from registers reads them after its issue: the compiler, which sees the asm
  // consume them at issue, must not reuse those registers until the product retired.
  // Issue one product as its own wgmma group (fence, MMAs, commit), its accumulators fenced on both sides.
  auto start_scores = [&](SteppedDescriptor k_tile) {
    fence_operands(s_flat);
    wgmma_fence();
    issue_scores(s_flat, desc.q_rows, k_tile);
    wgmma_commit();
    fence_operands(s_flat);
  };
  auto start_pv = [&](SteppedDescriptor v_tile) {
    fence_operands(o_flat);
    wgmma_fence();
    issue_pv(o_flat, probs, v_tile);
    wgmma_commit();
    fence_operands(o_flat);
  };
  auto retire_pv = [&]() {
    wgmma_wait<0>();
    fence_operands(o_flat);
    fence_operands(reinterpret_cast<uint32_t(&)[BLOCK_N / 4]>(probs));
  };

  for (int i = 0; i < num_tiles; ++i) {
    advance_ring(i);
    const uint32_t slot_offset = (i % KV_STAGES) * kKVBytes;
    start_scores(desc.k_ring.plus(slot_offset));
    wgmma_wait<0>();
    fence_operands(s_flat);
    softmax.rescale(acc_o, correction, exponentiate_tile(i));
    pack_probabilities(probs, scores);
    start_pv(desc.v_ring.plus(slot_offset));
    retire_pv();
  }

  // ---- epilogue: normalise, LSE, stage the tile in shared memory (padded rows), 16-byte stores
  float inv_sum[1][2], row_lse[1][2];
  softmax.finalize(inv_sum, row_lse, p.scale_log2);
  cp_async_wait<0>();
  __syncthreads();  // every warpgroup is done reading Q / K / V shared memory
  Elem* smem_o = reinterpret_cast<Elem*>(smem_raw + (k_ring - smem.raw));
  stage_output_rows(smem_o, acc_o, inv_sum, row_lse, warp_row0, g, t, p0, packed_rows, group, tile.kv_head, tile.batch, p.lse,
                    p.lse_batch_stride, p.lse_head_stride, tile.span.q_token0);
  __syncthreads();
  Elem* o_base = out_rows(p, tile);
  store_o_tile<HEAD_DIM, kBlockM, kThreads>(o_base, smem_o, p.o_seq_stride, p.o_head_stride, p0, packed_rows, group,
                                            fresh_thread_index());
}
