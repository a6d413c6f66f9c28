// hf_flashpatch: warp-specialised Hopper forward kernel (sm_90a): a producer warpgroup streams K/V,
// NUM_WG math warpgroups compute, and no block-wide barrier sits in the key loop.
//
// Same contract as cuda/fwd.cu (same arguments, layouts, masks, GQA packing,
// varlen, LSE): q (B, S_q, H, D), k (B, S_k, H_kv, D), v (B, S_k, H_kv, D_v), out (B, S_q, H, D_v), lse
// (B, H, S_q) or (H, T_q). D_v = D, or multi-head latent attention's D = 192, D_v = 128.
//
// Warpgroup 0 (the producer, 24 registers per thread after setmaxnreg) copies the packed Q tile with
// cp.async, and then one of its threads streams key tile after key tile into a KV_STAGES-deep ring of
// 128-byte-swizzled tiles with the TMA (tma.cuh): per tile it arrives on the slot's "full" mbarrier announcing
// the tile's bytes and issues one box per 64 columns of K and of V, which complete that barrier's phase as
// they land. Before reusing a slot it waits on the slot's "empty" mbarrier, which every math warp arrives on
// once its products have read the tile. Warpgroups 1..NUM_WG (240 registers each; 160 with three at d64) own
// 64 query rows each and run the key loop (key_loop in fwd_hopper_step.cuh): S = Q K^T, soft-cap, mask,
// online softmax, O += P V, all on wgmma, with each tile's softmax under the previous tile's P V. Without a
// block-wide barrier per tile the math warpgroups also drift apart, so one's softmax overlaps the other's
// products.
//
// The boxes never cross a sequence's end: a batched tensor map ends where the sequence does (rows past it
// are zero-filled), and a varlen sequence's partial last key tile is copied by the producer's threads with
// cp.async (zero-filling the rows past its end) before the TMA takes over.
//
// Compile-time configuration: HEAD_DIM and HEAD_DIM_V (64/64, 128/128 or 192/128), BLOCK_N (64 or 128),
// NUM_WG (math warpgroups), KV_STAGES (>= 2), OVERLAP_SOFTMAX (key_loop), ELEM_BF16, HAS_MASK.
#include "fwd_hopper_step.cuh"
using namespace hfp;
using namespace hfp::fwd;
using namespace hfp::sm90;
using namespace hfp::tma;

namespace {

constexpr int kProducerThreads = 128;
constexpr int kThreads = kProducerThreads + kMathThreads;
// setmaxnreg moves registers within the pool the CTA was launched with: ptxas caps a 384-thread kernel
// at 168 registers per thread (65536 / 384, rounded down to a multiple of 8), so the split must fit
// 168 x 384. A request beyond the pool never returns (a first version with 32 + 2 x 240 hung).
// 192-wide K rows take the producer more addresses (three sub-tiles): 32 / 232 there, 24 / 240 otherwise.
// Three math warpgroups (512 threads, d64's 192-row tiles) leave a pool of 128 per thread: 24 + 3 x 160.
constexpr int kProducerRegisters = HEAD_DIM == 192 ? 32 : 24;
constexpr int kMathRegisters = NUM_WG == 3 ? 160 : HEAD_DIM == 192 ? 232 : 240;
constexpr int kEntryRegisters = (65536 / kThreads) / 8 * 8;
static_assert(kProducerRegisters * kProducerThreads + kMathRegisters * kMathThreads <= kEntryRegisters * kThreads,
              "the register split must fit the CTA's pool");
constexpr int kMathWarps = kMathThreads / 32;
constexpr int kMathBarrier = 1;      // named barrier among the math warpgroups (0 is __syncthreads)
constexpr int kProducerBarrier = 2;  // named barrier among the producer warpgroup's threads
static_assert(NUM_WG == 2 || (NUM_WG == 3 && HEAD_DIM == 64), "two math warpgroups, or three at head dim 64");
static_assert(KV_STAGES >= 2, "a ring of at least two stages: one tile computed while the next lands");

}  // namespace

// The dynamic shared memory: the tiles, then the full and empty mbarrier of every stage (read by the launch
// from the compiled module: Kernel.shared_bytes).
extern "C" __constant__ int hfp_attention_forward_sm90_ws_shared_bytes = kSharedTilesBytes + 2 * 8 * KV_STAGES;

extern "C" __global__ void __launch_bounds__(kThreads, 1) hfp_attention_forward_sm90_ws(const __grid_constant__ hfp::fwd::FwdParams p) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const SharedTiles smem = shared_tiles(smem_raw);
  const uint32_t full_bars = smem.end;                   // (KV_STAGES,) mbarriers, 8 bytes each
  const uint32_t empty_bars = full_bars + KV_STAGES * 8;      // (KV_STAGES,)

  const int tid = threadIdx.x;

  // ---- the tile's rows and the key tiles they see, computed by every warp (fwd_geometry.cuh)
  const QueryTile tile = query_tile<kWindowed, kBlockM, BLOCK_N>(p);
  if (tile.empty()) return;  // the whole CTA, before any barrier
  const int seqlen_k = tile.span.seqlen_k, group = tile.group, packed_rows = tile.packed_rows, p0 = tile.p0;
  const int n_block_max = tile.keys.n_block_max, num_tiles = tile.keys.num_tiles;

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < KV_STAGES; ++s) {
      mbarrier_init(full_bars + 8 * s, 1);  // the producer thread's arrival (+ the bytes it announces)
      mbarrier_init(empty_bars + 8 * s, kMathWarps);
    }
  }
  __syncthreads();  // the barriers are initialised before anyone waits on or arrives at them

  if (tid < kProducerThreads) {
    // =============================== producer ===============================
    registers_decrease<kProducerRegisters>();
    // Every producer thread copies its share of the packed Q tile and, where the first key tile runs past a
    // varlen sequence's end, of that tile (cp.async, zero-filling the rows past the sequence: a TMA box there
    // would read the next sequence's keys, finite or not). Then thread 0 alone streams the rest.
    const bool varlen = p.cu_seqlens_k != nullptr;
    const int first_by_threads = varlen && num_tiles > 0 && n_block_max * BLOCK_N > seqlen_k ? 1 : 0;
    for_each_packed_chunk<HEAD_DIM, kBlockM, kProducerThreads>(
        tid, p0, packed_rows, group, [&](int row, int col, int pos, int head, bool valid) {
          const Elem* src = tile.q_rows + (valid ? pos * p.q_seq_stride + head * p.q_head_stride + col : 0);
          cp_async_16(smem.q_tile + (col / 64) * (kBlockM * kSubTileRowBytes) + sw128_offset(row, (col % 64) / 8), src,
                      valid);
        });
    if (first_by_threads) {
      const int key0 = (n_block_max - 1) * BLOCK_N;
      load_kv_tile_sw128<HEAD_DIM, kProducerThreads, 2>(smem.k_ring, tile.k_rows, p.k_seq_stride, key0, seqlen_k, tid);
      load_kv_tile_sw128<HEAD_DIM_V, kProducerThreads, 2>(smem.v_ring, tile.v_rows, p.v_seq_stride, key0, seqlen_k,
                                                          tid);
    }
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async_shared();  // the copies, for the tensor cores' reads
    named_barrier_sync(kProducerBarrier, kProducerThreads);  // every producer thread's copies landed
    if (tid != 0) return;
    if (first_by_threads) mbarrier_arrive(full_bars);  // tile 0 (slot 0) is complete, and Q with it
    // Tile i goes to ring slot i % KV_STAGES once the math warps released the tile before it there: one
    // arrival announcing the slot's bytes, then a box per 64 columns of K and of V, landing on the same
    // barrier. The first of them also publishes Q (the arrival follows the barrier above).
    prefetch(p.k_tma);
    prefetch(p.v_tma);
    const int batch = varlen ? 0 : tile.batch;  // varlen maps: the packed tokens, a batch of 1
    const int row0 = static_cast<int>(tile.span.k_token0);
    for (int i = first_by_threads; i < num_tiles; ++i) {
      const int slot = i % KV_STAGES;
      if (i >= KV_STAGES) mbarrier_wait(empty_bars + 8 * slot, (i / KV_STAGES - 1) & 1);
      const int key_row = row0 + (n_block_max - 1 - i) * BLOCK_N;
      const uint32_t full = full_bars + 8 * slot;
      arrive_expect_bytes(full, kKBytes + kVBytes);
#pragma unroll
      for (int sub = 0; sub < HEAD_DIM / 64; ++sub)
        load_box(smem.k_ring + slot * kKBytes + sub * (BLOCK_N * kSubTileRowBytes), p.k_tma, sub * 64, tile.kv_head,
                 key_row, batch, full);
#pragma unroll
      for (int sub = 0; sub < HEAD_DIM_V / 64; ++sub)
        load_box(smem.v_ring + slot * kVBytes + sub * (BLOCK_N * kSubTileRowBytes), p.v_tma, sub * 64, tile.kv_head,
                 key_row, batch, full);
    }
    return;
  }

  // =============================== math warpgroups ===============================
  registers_increase<kMathRegisters>();
  const int math_tid = tid - kProducerThreads;
  const int lane = math_tid & 31;
  const int warp = math_tid >> 5;
  const int warpgroup = uniform_warpgroup(math_tid);  // = warp >> 2
  const int g = lane >> 2, t = lane & 3;
  const int warp_row0 = warp * 16;
  const OperandDescriptors desc = operand_descriptors(smem, warpgroup);

  MathRows rows;
  rows.init();
  // Ring slot i % KV_STAGES holds tile i.
  auto wait_tile = [&](int i) -> uint32_t {
    const int slot = i % KV_STAGES;
    mbarrier_wait(full_bars + 8 * slot, (i / KV_STAGES) & 1);
    return slot;
  };
  auto release = [&](int i) {
    __syncwarp();
    if (lane == 0) mbarrier_arrive(empty_bars + 8 * (i % KV_STAGES));  // this warp is done with the slot
  };
  key_loop<kWindowed>(rows, p, tile, p0 + warp_row0 + g, t, desc.q_rows, desc.k_ring, desc.v_ring, wait_tile, release);

  // ---- epilogue (fwd_hopper_step.cuh): normalise, LSE, stage in shared memory, 16-byte stores
  store_output(rows, p, tile, smem_raw, smem, warp_row0, g, t, [] { named_barrier_sync(kMathBarrier, kMathThreads); },
               kProducerThreads);
}
