// hf_flashpatch: Hopper forward kernel (sm_90a): both GEMMs of a key tile on warpgroup MMA (wgmma).
//
// Same contract as cuda/fwd.cu (same arguments, layouts, masks, GQA packing, varlen, LSE):
// q (B, S_q, H, D), k/v (B, S_k, H_kv, D) with arbitrary batch/seq/head strides and a contiguous head
// dim; out like q (strides passed); lse (B, H, S_q) or, varlen, (H, T_q), fp32 natural log.
//
// One CTA computes BLOCK_M = 64 * NUM_WG packed rows (query positions x the query heads of one GQA
// group) of one (kv head, batch) pair; warpgroup w owns rows [64 w, 64 w + 64), its warp j rows
// 64 w + 16 j + [0, 16). Per key tile (walked from the last visible tile down; consume_key_tile in
// fwd_hopper_common.cuh, the step the warp-specialised body runs too):
//   S = Q K^T: wgmma m64 x BLOCK_N x k16, Q and K both from SW128 shared-memory tiles (K-major);
//   soft-cap, mask (boundary tiles only), online softmax in base 2: the accumulator layout is, per warp,
//   mma.sync's C layout, so fwd_softmax.cuh's code (MT = 1) applies unchanged;
//   O += P V: wgmma m64 x HEAD_DIM x k16 with P packed in registers (A operand) and V from its SW128
//   tile read MN-major (transposed by the tensor core, no ldmatrix.trans).
// K/V tiles stream through a KV_STAGES-deep cp.async ring written in the swizzled format; the next
// tile's copy overlaps this tile's math.
//
// Compile-time configuration (-D, from ForwardConfig in hf_flashpatch/kernels/forward.py):
//   HEAD_DIM (64 or 128) and HEAD_DIM_V (= HEAD_DIM here), BLOCK_N (64 or 128), NUM_WG, KV_STAGES, ELEM_BF16,
//   HAS_MASK.
#include "fwd_hopper_common.cuh"
using namespace hfp;
using namespace hfp::fwd;
using namespace hfp::sm90;

namespace {
// Tiles in flight ahead of the one being consumed: every ring slot but the one being read.
constexpr int kThreads = kMathThreads;
constexpr int kLookahead = KV_STAGES - 1;
static_assert(kLookahead >= 1, "the ring needs a free slot to prefetch into");
}  // namespace

// The dynamic shared memory (read by the launch from the compiled module: Kernel.shared_bytes).
extern "C" __constant__ int hfp_attention_forward_sm90_shared_bytes = kSharedTilesBytes;

extern "C" __global__ void __launch_bounds__(kThreads, 1) hfp_attention_forward_sm90(const __grid_constant__ hfp::fwd::FwdParams p) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const SharedTiles smem = shared_tiles(smem_raw);

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int warpgroup = uniform_warpgroup(tid);  // = warp >> 2

  // ---- the tile's rows and the key tiles they see (fwd_geometry.cuh)
  const QueryTile tile = query_tile<kWindowed, kBlockM, BLOCK_N>(p);
  if (tile.empty()) return;
  const int seqlen_k = tile.span.seqlen_k, group = tile.group, packed_rows = tile.packed_rows, p0 = tile.p0;
  const int n_block_max = tile.keys.n_block_max, num_tiles = tile.keys.num_tiles;

  const int g = lane >> 2, t = lane & 3;
  const int warp_row0 = warp * 16;  // = 64 * warpgroup + 16 * (warp % 4)
  const OperandDescriptors desc = operand_descriptors(smem, warpgroup);

  // ---- prologue: Q and the first kLookahead key tiles in flight
  for_each_packed_chunk<HEAD_DIM, kBlockM, kThreads>(
      tid, p0, packed_rows, group, [&](int row, int col, int pos, int head, bool valid) {
        const Elem* src = tile.q_rows + (valid ? pos * p.q_seq_stride + head * p.q_head_stride + col : 0);
        cp_async_16(smem.q_tile + (col / 64) * (kBlockM * kSubTileRowBytes) + sw128_offset(row, (col % 64) / 8), src, valid);
      });
#pragma unroll
  for (int s = 0; s < kLookahead; ++s) {
    if (s < num_tiles) {
      const int key0 = (n_block_max - 1 - s) * BLOCK_N;
      load_kv_tile_sw128<HEAD_DIM, kThreads>(smem.k_ring + s * kKBytes, tile.k_rows, p.k_seq_stride, key0,
                                             seqlen_k, tid);
      load_kv_tile_sw128<HEAD_DIM_V, kThreads>(smem.v_ring + s * kVBytes, tile.v_rows, p.v_seq_stride, key0,
                                               seqlen_k, tid);
    }
    cp_async_commit();
  }

  MathRows rows;
  rows.init();
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
      load_kv_tile_sw128<HEAD_DIM, kThreads>(smem.k_ring + slot * kKBytes, tile.k_rows, p.k_seq_stride,
                                             ahead_key0, seqlen_k, tid);
      load_kv_tile_sw128<HEAD_DIM_V, kThreads>(smem.v_ring + slot * kVBytes, tile.v_rows, p.v_seq_stride,
                                               ahead_key0, seqlen_k, tid);
    }
    cp_async_commit();
  };

  for (int i = 0; i < num_tiles; ++i) {
    advance_ring(i);
    const int slot = i % KV_STAGES;
    consume_key_tile<kWindowed>(rows, p, tile, (n_block_max - 1 - i) * BLOCK_N, p0 + warp_row0 + g, t, desc.q_rows,
                                desc.k_ring.plus(slot * kKBytes), desc.v_ring.plus(slot * kVBytes));
  }

  // ---- epilogue (fwd_hopper_common.cuh): normalise, LSE, stage in shared memory, 16-byte stores
  cp_async_wait<0>();  // no copy is in flight into the ring the output is staged in
  store_output(rows, p, tile, smem_raw, smem, warp_row0, g, t, [] { __syncthreads(); }, 0);
}
