// hf_flashpatch: warp-specialised Hopper forward kernel (sm_90a): a producer warpgroup streams K/V,
// NUM_WG math warpgroups compute, and no block-wide barrier sits in the key loop.
//
// Same contract as cuda/fwd.cu (same arguments, layouts, masks, GQA packing,
// varlen, LSE): q (B, S_q, H, D), k (B, S_k, H_kv, D), v (B, S_k, H_kv, D_v), out (B, S_q, H, D_v), lse
// (B, H, S_q) or (H, T_q). D_v = D, or multi-head latent attention's D = 192, D_v = 128.
//
// Each CTA walks work tiles (a query tile of one KV head and sequence; a pair's tiles consecutive, heaviest
// first: persistent_work in fwd_geometry.cuh), persistent (one CTA per SM) where the tiles weigh the same.
// Warpgroup 0 is the producer (24 registers per thread after setmaxnreg, 40 with the Q thread, 32 beside three
// math warpgroups): one of its threads streams every work's key tiles into a KV_STAGES-deep ring of
// 128-byte-swizzled tiles with the TMA (tma.cuh): per tile, for K and then V, it arrives on that half's "full"
// mbarrier announcing its bytes and issues one box per 64 columns, which complete the barrier's phase as they land.
// Before reusing a slot's K (V) it waits on its "empty" mbarrier, which every math warp arrives on once S = Q K^T (P V)
// has read it, so the next K lands while this V is still read. The ring runs on from one work to the next, so the next
// work's tiles land under this one's last products and its output stores. KV_CLUSTER = 2 builds run in clusters of two
// CTAs that take two query tiles of one pair at a time: each producer loads half of every tile's rows into both CTAs'
// rings (a multicast box), and a slot's "empty" mbarrier counts both CTAs' math warps. Where the launch passes
// q_box_heads (the shape's q_by_tma, a group that divides 64), another producer thread loads each math warpgroup's 64 Q
// rows (one box per 64 columns) once every S = Q K^T of the warpgroup's work before retired (its "Q empty" mbarrier),
// so the next work's Q lands under this one's last P V and output stores. Warpgroups 1..NUM_WG (240 registers each, 232
// with the Q thread, 160 with three at d64) own 64 query rows each: per work they wait for their Q rows (or copy them
// with cp.async), compute the key tiles their own rows see and hand the work's others back unread (row_key_tiles), run
// the key loop (key_loop in fwd_hopper_step.cuh: S = Q K^T, soft-cap, mask, online softmax, O += P V, all on wgmma) and
// store their output rows from registers (TMA_OUTPUT: each warp by the TMA, from its Q rows). Without a block-wide
// barrier per tile the math warpgroups drift apart, so one's softmax overlaps the other's products; WARPGROUP_TURNS
// builds hold them apart: the warpgroups issue each step's products in turns (FlashAttention-3's warp-scheduler
// barriers), so one's softmax runs under the others' products rather than beside its own.
//
// Batched tensor maps end where the sequence does (rows past it are zero-filled). A varlen sequence's
// partial last key tile is a box that reads the next sequence's first rows: their scores are masked (the
// mask overwrites whatever the product gave), and the math warps zero those V rows before P V reads them.
//
// Compile-time configuration: HEAD_DIM and HEAD_DIM_V (64/64, 128/128 or 192/128), BLOCK_N (64, 128 or 160),
// NUM_WG (math warpgroups), KV_STAGES (>= 2), Q_BY_TMA (Q rows by a producer thread,
// where the launch passes q_box_heads), OWN_KEY_TILES (each warpgroup's own key tiles), STAGED_OUTPUT (the output
// through the Q rows), KV_CLUSTER (CTAs sharing each K/V tile by a multicast; 1 unless the build names it),
// TMA_OUTPUT (the output by the TMA from each warp's Q rows), WARPGROUP_TURNS (the math warpgroups take turns at
// issuing their products), SPLIT_TAIL (the chained walk's last round split by key tiles over the grid, where the
// launch passes tail_parts: fwd_split_tail.cuh), ELEM_BF16, HAS_MASK.
#ifndef KV_CLUSTER
#define KV_CLUSTER 1
#endif
#ifndef TMA_OUTPUT
#define TMA_OUTPUT 0
#endif
#ifndef WARPGROUP_TURNS
#define WARPGROUP_TURNS 0
#endif
#include "fwd_hopper_chain.cuh"
#include "fwd_tile_handoff.cuh"
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
// Three math warpgroups (512 threads, d64's 192-row tiles) leave a pool of 128 per thread: 32 + 3 x 160 (the
// Q thread's masked walk spills at 24). With two math warpgroups and the Q thread: 40 + 2 x 232, the whole pool.
constexpr int kProducerRegisters = NUM_WG == 3 ? 32 : Q_BY_TMA ? 40 : 24;
constexpr int kMathRegisters = NUM_WG == 3 ? 160 : Q_BY_TMA ? 232 : 240;
constexpr int kEntryRegisters = (65536 / kThreads) / 8 * 8;
static_assert(kProducerRegisters * kProducerThreads + kMathRegisters * kMathThreads <= kEntryRegisters * kThreads,
              "the register split must fit the CTA's pool");
constexpr int kMathWarps = kMathThreads / 32;
constexpr int kMathBarrier = 1;   // named barrier among the math warpgroups (0 is __syncthreads)
constexpr int kQRowsBarrier = 2;  // 2 + w: math warpgroup w's threads (its Q rows)
// WARPGROUP_TURNS: kTurnBarrier + w is math warpgroup w's turn to issue products (its 128 threads wait on it; the
// warpgroup before, which passes the turn, arrives on it). The turns go 0, 1, .., NUM_WG - 1, 0, ..
constexpr bool kWarpgroupTurns = WARPGROUP_TURNS != 0;
constexpr int kTurnBarrier = kQRowsBarrier + NUM_WG;
static_assert(kTurnBarrier + NUM_WG <= 16, "16 hardware barriers");
static_assert(NUM_WG == 2 || (NUM_WG == 3 && HEAD_DIM == 64), "two math warpgroups, or three at head dim 64");
static_assert(KV_STAGES >= 2, "a ring of at least two stages: one tile computed while the next lands");
constexpr bool kQByTma = Q_BY_TMA != 0;
constexpr bool kOwnKeyTiles = OWN_KEY_TILES != 0;
// STAGED_OUTPUT: the output leaves through shared memory in 16-byte stores of whole rows, staged in the warpgroup's
// Q rows, free from a work's last S to the next work's copy (so not with Q by the TMA, which may land the next Q
// there first); else it is stored from the accumulators.
constexpr bool kStagedOutput = STAGED_OUTPUT != 0;
// TMA_OUTPUT: where the launch passes an output map (o_box_heads: a batched problem whose group divides 16), each warp
// stages its 16 output rows in its own Q rows and stores them with the TMA (store_output), so its threads issue no
// global store; the next work's Q copy waits until the boxes were read. Not with the staged output. With Q by the
// TMA (which may land the next Q in those rows first; kKeySlotOutput) the rows are staged in the K slot of the work's
// last key tile instead, once the other warpgroup's last S retired (last_s_bars, by work parity), and each warp hands
// that slot back only once its boxes were read: 128-key tiles of 128 rows, so the slot has the Q tile's layout.
constexpr bool kTmaOutput = TMA_OUTPUT != 0;
constexpr bool kKeySlotOutput = kTmaOutput && kQByTma;
// kKeySlotOutput: the Q thread, which walks a work ahead of the math warps, hands them each work's tile through shared
// memory (TileHandoff, fwd_tile_handoff.cuh), which they take under the last P V of the work before; it runs for
// that alone where the launch passes no Q map. Elsewhere each role decodes the walk itself (in the one-CTA-per-tile
// d128 build, at d64 and at 192/128 a tile kept over the epilogue spilled).
constexpr bool kHandedTiles = kKeySlotOutput;
static_assert(!kHandedTiles || !kOwnKeyTiles, "the next work's tile is taken in the work's one key loop");
static_assert(!kTmaOutput || (!kStagedOutput && HEAD_DIM >= HEAD_DIM_V),
              "the output boxes are staged in the warp's copied Q rows, or (Q by the TMA) in a K slot");

// KV_CLUSTER = 2: the grid runs in clusters of two CTAs that take works of one pair with the same key tiles at the
// same time (heuristics.clustered_schedule launches it only so: with CTA b of a round taking work b, an unmasked
// fixed-length problem whose pairs have an even number of query tiles), and each CTA's producer loads half the
// rows of every K and V tile into both CTAs' rings (a TMA multicast): the L2 serves each tile once per cluster. A
// slot is then reused once the math warps of both CTAs released it.
constexpr int kKvCluster = KV_CLUSTER;
static_assert(kKvCluster == 1 || (kKvCluster == 2 && !kWindowed && !kQByTma && !kOwnKeyTiles && BLOCK_N % 16 == 0),
              "K/V multicast: unmasked works of equal key tiles, the math warps copying Q, tiles of whole 8-row "
              "swizzle atoms per CTA");
static_assert(!kSplitTail || kChainedWalk, "a split last round: the chained walk's (fwd_hopper_chain.cuh)");
static_assert(!kKeySlotOutput || (BLOCK_N == kBlockM && HEAD_DIM == HEAD_DIM_V && NUM_WG == 2 && kKvCluster == 1),
              "output boxes staged in a K slot: a slot of the Q tile's layout, two math warpgroups, no multicast");
constexpr int kKvRowsPerCta = BLOCK_N / kKvCluster;  // the K/V rows of a tile that one CTA's producer loads
static_assert(!kStagedOutput || (!kQByTma && HEAD_DIM_V == 128 && HEAD_DIM >= 128),
              "a warpgroup's output (64 x 128) staged in its copied Q rows of two 64-column sub-tiles");
template <int N>
struct Columns {  // a tile's column count as a type, for the producer's one load for K and V
  static constexpr int value = N;
};

}  // namespace

// The dynamic shared memory: the tiles, then the full and empty mbarriers of every stage's K and V and of every
// math warpgroup's Q rows, and (kKeySlotOutput) the K slot's last-S mbarriers (read by the launch from the compiled
// module: Kernel.shared_bytes), then (kHandedTiles) the tile handoff, 16-byte aligned.
constexpr int kBarrierBytes = 4 * 8 * KV_STAGES + 2 * 8 * NUM_WG + (kKeySlotOutput ? 2 * 8 * NUM_WG : 0);
constexpr int kSharedBytes =
    kSharedTilesBytes + kBarrierBytes + (kHandedTiles ? (16 - kBarrierBytes % 16) % 16 + kTileHandoffBytes : 0);
extern "C" __constant__ int hfp_attention_forward_sm90_ws_shared_bytes = kSharedBytes;

// Grid (CTAs, 1, 1) (heuristics.hopper_forward_schedule: one CTA per SM where every tile weighs the same or a
// sectioned order deals masked tiles out evenly, else one per tile); CTA b takes work tile b of every round of
// gridDim.x tiles, masked builds in reverse every odd round (walk_work, persistent_work), and every role walks the
// same ones and skips the same empty ones. The
// K/V ring runs on across work tiles: a work's key tile i is the ring's tile `ring + i`, in slot
// (ring + i) % KV_STAGES, pass (ring + i) / KV_STAGES, so the next work's first tiles land while the math
// warps finish this one. A math warpgroup's 64 Q rows are its own (no other warpgroup reads them): the
// producer's second thread loads them by the TMA (Q_BY_TMA builds, groups that divide 64), or the warpgroup
// copies them.
#if KV_CLUSTER > 1
#define HFP_FORWARD_CLUSTER __cluster_dims__(KV_CLUSTER, 1, 1)
#else
#define HFP_FORWARD_CLUSTER
#endif
// kPieces: the split last round's pieces (the SPLIT_TAIL builds' second entry, launched after the first, which walks
// the full rounds): the producer streams only the pieces' key tiles, the math warpgroups walk them (walk_pieces). A
// kernel of its own, so the first entry's chained walk keeps the schedule it has without a split (in one kernel, the
// pieces' code made ptxas order its steady softmax otherwise).
template <bool kPieces>
__device__ __forceinline__ void attention_forward_ws(const hfp::fwd::FwdParams& p) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const SharedTiles smem = shared_tiles(smem_raw);
  // mbarriers, 8 bytes each: (KV_STAGES,) of every kind. K and V of a slot land and are handed back apart, so that
  // the next K may land while this V is still read (the key loop issues S(i) before P(i-1) V(i-1) retires).
  const uint32_t k_full_bars = smem.end;
  const uint32_t v_full_bars = k_full_bars + KV_STAGES * 8;
  const uint32_t k_empty_bars = v_full_bars + KV_STAGES * 8;
  const uint32_t v_empty_bars = k_empty_bars + KV_STAGES * 8;
  const uint32_t q_full_bars = v_empty_bars + KV_STAGES * 8;  // (NUM_WG,): a math warpgroup's Q rows landed
  const uint32_t q_empty_bars = q_full_bars + NUM_WG * 8;   // (NUM_WG,): its last S of a work retired
  // kKeySlotOutput, (NUM_WG, 2): a warpgroup's last S of an even / odd work retired. Two per warpgroup, so that the
  // other warpgroup, which may be a work ahead (the turns let it start the next work's first S), cannot complete
  // the phase a slow waiter still reads; the Q thread's "Q empty" barrier has no such slack.
  const uint32_t last_s_bars = q_empty_bars + NUM_WG * 8;
  const TileHandoff handoff =
      TileHandoff::at((smem.end + kBarrierBytes + 15) & ~15u, smem_raw, hfp::smem_addr(smem_raw));
  const bool q_by_tma = kQByTma && p.q_box_heads > 0;  // else the math warps copy their Q rows
  const int tid = threadIdx.x;
  const bool varlen = p.cu_seqlens_k != nullptr;

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < KV_STAGES; ++s) {
      mbarrier_init(k_full_bars + 8 * s, 1);  // the producer thread's arrival (+ the bytes it announces)
      mbarrier_init(v_full_bars + 8 * s, 1);
      mbarrier_init(k_empty_bars + 8 * s, kMathWarps * kKvCluster);  // every math warp of the cluster
      mbarrier_init(v_empty_bars + 8 * s, kMathWarps * kKvCluster);
    }
    if constexpr (kQByTma) {
#pragma unroll
      for (int w = 0; w < NUM_WG; ++w) {
        mbarrier_init(q_full_bars + 8 * w, 1);  // the Q thread's arrival (+ the bytes it announces)
        mbarrier_init(q_empty_bars + 8 * w, 4);  // the warpgroup's four warps
      }
    }
    if constexpr (kKeySlotOutput) {
#pragma unroll
      for (int b = 0; b < 2 * NUM_WG; ++b) mbarrier_init(last_s_bars + 8 * b, 4);  // the warpgroup's four warps
    }
    if constexpr (kHandedTiles) handoff.init();
    if constexpr (kChainedWalk) {  // the Q barriers' area as (2 Q tiles, NUM_WG): a warpgroup's next Q rows landed
#pragma unroll
      for (int b = 0; b < 2 * NUM_WG; ++b) mbarrier_init(q_full_bars + 8 * b, 4);  // the warpgroup's four warps
    }
    if constexpr (kKvCluster > 1) fence_mbarrier_init_cluster();
  }
  // The barriers are initialised before anyone waits on or arrives at them (in the cluster: before a peer's copies
  // or arrivals reach them).
  if constexpr (kKvCluster > 1) {
    cluster_sync();
  } else {
    __syncthreads();
  }
  const uint32_t cta_rank = kKvCluster > 1 ? cluster_rank() : 0;

  if (tid < kProducerThreads) {
    // =============================== producer ===============================
    registers_decrease<kProducerRegisters>();
    if (tid == 32 && (q_by_tma || kHandedTiles)) {
      // Warp 1's first thread loads each math warpgroup's Q rows: a box per 64 columns of q_box_heads heads x
      // 64 / q_box_heads positions (64 packed rows, the heads fastest), once the warpgroup's products of the work
      // before no longer read them. A thread of its own, so that no warpgroup's Q waits behind key tiles that
      // another warpgroup has not released yet. kHandedTiles: it first publishes the work's tile for the math warps.
      if (q_by_tma) prefetch(p.q_tma);
      int works = 0;
      for_each_work<kWindowed, kBlockM, BLOCK_N, kSplitTail>(p, [&](const QueryTile& tile) {
        if constexpr (kHandedTiles) handoff.publish(works, tile);
        const int batch = varlen ? 0 : tile.batch;  // varlen maps: the packed tokens, a batch of 1
#pragma unroll
        for (int wg = 0; wg < NUM_WG; ++wg) {
          if (works > 0) mbarrier_wait(q_empty_bars + 8 * wg, (works - 1) & 1);
          if (!q_by_tma) continue;  // kHandedTiles alone: the wait keeps the slots from being overwritten early
          const uint32_t full = q_full_bars + 8 * wg;
          arrive_expect_bytes(full, 64 * HEAD_DIM * 2);
          const int position = static_cast<int>(tile.span.q_token0) + (tile.p0 + 64 * wg) / tile.group;
#pragma unroll
          for (int sub = 0; sub < HEAD_DIM / 64; ++sub)
            load_box(smem.q_tile + sub * (kBlockM * kSubTileRowBytes) + wg * (64 * kSubTileRowBytes), p.q_tma,
                     sub * 64, tile.kv_head * tile.group, position, batch, full);
        }
        ++works;
      });
      if constexpr (kHandedTiles) handoff.publish(works, QueryTile{});  // the end of the walk
      return;
    }
    if (tid != 0) return;
    // Thread 0 streams every work's key tiles: before reusing a slot it waits until the math warps released
    // the tile a pass before; then one arrival announcing the slot's bytes, and a box per 64 columns of K and
    // of V. A varlen sequence's partial last key tile reads rows of the next sequence too (or zeros past the
    // tensor): their scores are masked, and the math warps zero those V rows before P V reads them.
    prefetch(p.k_tma);
    prefetch(p.v_tma);
    int ring = 0;
    auto walk = [&](auto body) {
      if constexpr (kPieces) {
        for_each_tail_piece<kBlockM, BLOCK_N, KV_CLUSTER>(p, body);
      } else {
        for_each_work<kWindowed, kBlockM, BLOCK_N, kSplitTail>(p, body);
      }
    };
    walk([&](const QueryTile& tile) {
      const int batch = varlen ? 0 : tile.batch;  // varlen maps: the packed tokens, a batch of 1
      const int first_row = static_cast<int>(tile.span.k_token0) + (tile.keys.n_block_max - 1) * BLOCK_N;
      for (int i = 0; i < tile.keys.num_tiles; ++i, ++ring) {
        const int slot = ring % KV_STAGES, key_row = first_row - i * BLOCK_N;
        // K, then V: once the math warps handed back what the slot held a pass before, an arrival announcing the
        // tile's bytes on its "full" barrier and a box per 64 columns.
        auto claim = [&](uint32_t empty_bars, uint32_t full_bars, int bytes) -> uint32_t {
          if (ring >= KV_STAGES) mbarrier_wait(empty_bars + 8 * slot, (ring / KV_STAGES - 1) & 1);
          arrive_expect_bytes(full_bars + 8 * slot, bytes);
          return full_bars + 8 * slot;
        };
        auto load = [&](auto columns, uint32_t full, uint32_t ring_base, const TmaDescriptor& map) {
          constexpr int kColumns = decltype(columns)::value;
#pragma unroll
          for (int sub = 0; sub < kColumns / 64; ++sub) {
            // This CTA's rows of the tile (all of them, or its half of a multicast one, which the cluster's other
            // producer completes) in each 64-column sub-tile.
            const uint32_t dst = ring_base + slot * (BLOCK_N * kColumns * 2) + sub * (BLOCK_N * kSubTileRowBytes) +
                                 cta_rank * (kKvRowsPerCta * kSubTileRowBytes);
            const int row = key_row + static_cast<int>(cta_rank) * kKvRowsPerCta;
            if constexpr (kKvCluster > 1) {
              load_box_multicast(dst, map, sub * 64, tile.kv_head, row, batch, full, (1u << kKvCluster) - 1);
            } else {
              load_box(dst, map, sub * 64, tile.kv_head, row, batch, full);
            }
          }
        };
        load(Columns<HEAD_DIM>{}, claim(k_empty_bars, k_full_bars, kKBytes), smem.k_ring, p.k_tma);
        load(Columns<HEAD_DIM_V>{}, claim(v_empty_bars, v_full_bars, kVBytes), smem.v_ring, p.v_tma);
      }
    });
    if constexpr (kKvCluster > 1) {
      // The other CTA's math warps arrive on this CTA's empty barriers: stay until the last tiles of every slot
      // were released (by both CTAs), so that no arrival reaches a CTA that has exited.
      for (int r = max(0, ring - KV_STAGES); r < ring; ++r) {
        mbarrier_wait(k_empty_bars + 8 * (r % KV_STAGES), (r / KV_STAGES) & 1);
        mbarrier_wait(v_empty_bars + 8 * (r % KV_STAGES), (r / KV_STAGES) & 1);
      }
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
  // At 160 registers a math thread (three warpgroups) a lane index kept live across the key loop spilled: there the
  // per-work code (Q copy, zeroed rows, output) reads its thread index afresh and each release elects its lane
  // (elect.sync, a predicate). With more registers the index stays live, which keeps the key loop the shorter.
  constexpr bool kFreshIndex = kMathRegisters <= 160;
  auto per_work_math_tid = [&]() { return kFreshIndex ? fresh_thread_index() - kProducerThreads : math_tid; };
  auto first_lane = [&]() { return kFreshIndex ? elect_one() : lane == 0; };
  const int warp_row0 = warp * 16;
  const OperandDescriptors desc = operand_descriptors(smem, warpgroup);
  // The output's staging (kStagedOutput): this warp's 16 rows x HEAD_DIM_V, 4 KB, in its warpgroup's Q rows (64 rows
  // of 128 bytes in each 64-column sub-tile): warps 0, 1 of the warpgroup in sub-tile 0, warps 2, 3 in sub-tile 1.
  // kTmaOutput: this warp's own 16 Q rows in each 64-column sub-tile (the layout of an output box).
  const uint32_t staging = kTmaOutput ? smem.q_tile + warp_row0 * kSubTileRowBytes
                                      : smem.q_tile + ((warp & 3) >> 1) * (kBlockM * kSubTileRowBytes) +
                                            warpgroup * (64 * kSubTileRowBytes) + (warp & 1) * (16 * HEAD_DIM_V * 2);
  const bool tma_output = kTmaOutput && p.o_box_heads > 0;

  // The K/V ring's hand-over, per ring tile r: wait until its K (or V) landed (its slot), and this warp is done with it.
  auto wait_slot = [&](uint32_t full_bars, auto r) -> uint32_t {  // r: int, or the chain's uint32_t
    const int slot = r % KV_STAGES;
    mbarrier_wait(full_bars + 8 * slot, (r / KV_STAGES) & 1);
    return slot;
  };
  auto release_at = [&](uint32_t bar) {  // a slot's "empty" mbarrier
    __syncwarp();
    if (first_lane()) {
      mbarrier_arrive(bar);
      // A multicast slot is rewritten in both CTAs: the other CTA's producer waits for this warp too.
      if constexpr (kKvCluster > 1) mbarrier_arrive_in(bar, cta_rank ^ 1);
    }
  };
  auto release = [&](uint32_t empty_bars, int r) { release_at(empty_bars + 8 * (r % KV_STAGES)); };
  if constexpr (kChainedWalk) {  // one key loop over every work (fwd_hopper_chain.cuh)
    auto wait_keys = [&](uint32_t r) { return wait_slot(k_full_bars, r); };
    if constexpr (kPieces) {
      walk_pieces(p, smem.q_tile, desc, warp_row0, lane, kQRowsBarrier + warpgroup, wait_keys,
                  [&](uint32_t r) { return wait_slot(v_full_bars, r); }, [&](uint32_t r) { release(k_empty_bars, r); },
                  [&](uint32_t r) { release(v_empty_bars, r); });
    } else {
      chained_walk(p, smem.q_tile, desc, warp_row0, lane, kQRowsBarrier + warpgroup, q_full_bars + 8 * warpgroup,
                   v_full_bars, k_empty_bars, v_empty_bars, wait_keys, release_at);
    }
    bulk_wait_read<0>();  // the shared memory stays until the last boxes were read
    return;
  }
  // The turns (kWarpgroupTurns): every warpgroup takes a work's key tiles + 1 turns (a tile its rows do not see
  // one), so the turns stay in step over every work; warpgroup 0 goes first.
  auto take_turn = [&]() {
    if constexpr (kWarpgroupTurns) named_barrier_sync(kTurnBarrier + warpgroup, 256);
  };
  auto pass_turn = [&]() {
    if constexpr (!kWarpgroupTurns) return;
    const int next = warpgroup + 1;
    named_barrier_arrive(kTurnBarrier + (next == NUM_WG ? 0 : next), 256);
  };
  if (kWarpgroupTurns && warpgroup == 0) named_barrier_arrive(kTurnBarrier, 256);
  int ring = 0, works = 0;  // as the producer's
  // kKeySlotOutput: the ring tile whose K slot holds this warp's boxes of the work before, handed back (once the
  // boxes were read) after the next work's first S retired rather than on the way between the works (-1: none).
  int boxes_ring = -1;
  auto release_boxes_slot = [&]() {
    if (!kKeySlotOutput || boxes_ring < 0) return;
    bulk_wait_read<0>();  // this warp's boxes were read (only the first lane has groups)
    release(k_empty_bars, boxes_ring);
    boxes_ring = -1;
  };
  // The walk (the producer's order); kHandedTiles: the next work's tile taken from the Q thread under this work's last
  // P V.
  QueryTile next_tile;
  auto run_work = [&](const QueryTile& tile) {
    if (q_by_tma) {
      mbarrier_wait(q_full_bars + 8 * warpgroup, works & 1);  // this warpgroup's 64 Q rows landed
    } else {  // copy them, once every warp of this warpgroup is past the last work's products (and output boxes)
      if constexpr (kTmaOutput) bulk_wait_read<0>();  // every lane (only the first has groups)
      named_barrier_sync(kQRowsBarrier + warpgroup, 128);
      load_query_rows(smem, p, tile, warpgroup, per_work_math_tid() & 127);
      cp_async_commit();
      cp_async_wait<0>();
      fence_proxy_async_shared();  // the copies, for the tensor cores' reads
      named_barrier_sync(kQRowsBarrier + warpgroup, 128);
    }
    const int num_tiles = tile.keys.num_tiles;
    // kKeySlotOutput: this work's output boxes are staged in its last key tile's K slot, handed back after them.
    const bool slot_boxes = kKeySlotOutput && tma_output && num_tiles > 0;
    const int last_ring = ring + num_tiles - 1;
    const int first_key0 = (tile.keys.n_block_max - 1) * BLOCK_N;
    const bool partial_first = varlen && num_tiles > 0 && first_key0 + BLOCK_N > tile.span.seqlen_k;
    MathRows rows;
    rows.init();
    // This warpgroup's rows may see fewer key tiles than the work's (a causal diagonal's first tiles, a window's
    // last ones): it hands those slots back unread once they landed, so every warp arrives on each slot's
    // "empty" barrier once per pass, and every math thread takes part in zeroing a partial first tile.
    auto wait_values = [&](int r) -> uint32_t { return wait_slot(v_full_bars, r); };  // ring tile r's V landed
    // Ring tile r's K landed; with zero_values (a varlen sequence's partial first tile, so only outside the key
    // loop's steady state) its V too, whose rows past the sequence's end become zeros before any P V reads them.
    auto wait_keys = [&](int r, bool zero_values) -> uint32_t {
      const uint32_t slot = wait_slot(k_full_bars, r);
      if (zero_values) {
        wait_values(r);
        const int first_row = tile.span.seqlen_k - first_key0;
        zero_tile_rows<BLOCK_N, HEAD_DIM_V / 64, kMathThreads>(smem.v_ring + slot * kVBytes, first_row,
                                                               per_work_math_tid());
        fence_proxy_async_shared();
        named_barrier_sync(kMathBarrier, kMathThreads);
      }
      return slot;
    };
    // K is handed back once S retired, V once P V did; the work before's boxes' slot with the first K.
    auto release_keys = [&](int r) {
      if (!(slot_boxes && r == last_ring)) release(k_empty_bars, r);
    };
    auto release_values = [&](int r) { release(v_empty_bars, r); };
    auto skip_tile = [&](int r, bool zero_rows) {  // a tile none of this warpgroup's rows sees: handed back unread
      wait_keys(r, zero_rows);
      take_turn();
      pass_turn();
      release_keys(r);
      wait_values(r);
      release_values(r);
    };
    auto release_queries = [&]() {  // this warp's products no longer read the Q rows (nor the work's K slots)
      if (!q_by_tma && !kKeySlotOutput) return;
      __syncwarp();
      if (first_lane()) {
        mbarrier_arrive(q_empty_bars + 8 * warpgroup);  // (kHandedTiles: the Q thread waits on it with or without Q)
        if constexpr (kKeySlotOutput) mbarrier_arrive(last_s_bars + 8 * (2 * warpgroup + (works & 1)));
      }
    };
    // Under the work's last P V: the next work's tile, and (slot_boxes) the rows' normalisers and LSE.
    float inv_sum[1][2];
    auto under_last_pv = [&]() {
      if (slot_boxes) finish_rows(rows.softmax, p, tile, warp_row0, per_work_math_tid() & 31, inv_sum);
      if constexpr (kHandedTiles) next_tile = handoff.take(works + 1);
    };
    // The key loop over the key tiles of `keys`, the first of them ring tile `first`.
    auto run_key_loop = [&](const QueryTile& keys, int first, bool zero_first) {
      key_loop<kWindowed>(
          rows, p, keys, tile.p0 + warp_row0 + g, t, desc.q_rows, desc.k_ring, desc.v_ring,
          [&](int i) { return wait_keys(first + i, i == 0 && zero_first); },
          [&](int i) { return wait_values(first + i); },
          [&](int i) {
            release_keys(first + i);
            if (i == 0) release_boxes_slot();
          },
          [&](int i) { release_values(first + i); }, release_queries, under_last_pv, take_turn, pass_turn);
    };
    if constexpr (!kOwnKeyTiles) {
      run_key_loop(tile, ring, partial_first);
    } else {
      QueryTile own = tile;
      own.keys = row_key_tiles<kWindowed, 64, BLOCK_N>(tile, tile.p0 + 64 * warpgroup);
      const int skipped_first = own.keys.num_tiles > 0 ? tile.keys.n_block_max - own.keys.n_block_max : num_tiles;
      for (int i = 0; i < skipped_first; ++i) skip_tile(ring + i, i == 0 && partial_first);
      run_key_loop(own, ring + skipped_first, partial_first && skipped_first == 0);
      for (int i = skipped_first + own.keys.num_tiles; i < num_tiles; ++i) skip_tile(ring + i, false);
    }
    // ---- epilogue (fwd_hopper_step.cuh): normalise, LSE, store (kStagedOutput: through this warp's share of its
    // warpgroup's Q rows, which every S of the work has read; the next work's copy starts behind a barrier of the
    // warpgroup, so after this warp's reads)
    if constexpr (kKeySlotOutput) {
      release_boxes_slot();  // a work without key tiles: the work before's, still held
      if (slot_boxes) {  // the other warpgroup's last S retired: no product reads the slot any more
        mbarrier_wait(last_s_bars + 8 * (2 * (warpgroup ^ 1) + (works & 1)), (works >> 1) & 1);
        store_boxes(rows, p, tile, tile.p0 + warp_row0, per_work_math_tid() & 31,
                    smem.k_ring + (last_ring % KV_STAGES) * kKBytes + warp_row0 * kSubTileRowBytes, inv_sum);
        boxes_ring = last_ring;
      } else {
        store_output<false, true>(rows, p, tile, warp_row0, per_work_math_tid() & 31, 0, false);
      }
    } else {
      store_output<kStagedOutput, kTmaOutput>(rows, p, tile, warp_row0, per_work_math_tid() & 31, staging,
                                              tma_output);
    }
    ring += num_tiles;
    ++works;
  };
  if constexpr (kHandedTiles) {
    for (next_tile = handoff.take(0); !next_tile.empty();) {
      const QueryTile tile = next_tile;
      run_work(tile);
    }
  } else {
    for_each_work<kWindowed, kBlockM, BLOCK_N>(p, run_work);
  }
  release_boxes_slot();
  if constexpr (kTmaOutput) bulk_wait_read<0>();  // the shared memory stays until the last boxes were read
}

extern "C" __global__ void __launch_bounds__(kThreads, 1) HFP_FORWARD_CLUSTER hfp_attention_forward_sm90_ws(const __grid_constant__ hfp::fwd::FwdParams p) {
  attention_forward_ws<false>(p);
}

#if SPLIT_TAIL
// The split last round's pieces (attention_forward_ws<true>), launched after hfp_attention_forward_sm90_ws with the
// same parameters and shared memory.
extern "C" __constant__ int hfp_attention_forward_sm90_ws_pieces_shared_bytes = kSharedBytes;
extern "C" __global__ void __launch_bounds__(kThreads, 1) HFP_FORWARD_CLUSTER hfp_attention_forward_sm90_ws_pieces(const __grid_constant__ hfp::fwd::FwdParams p) {
  attention_forward_ws<true>(p);
}
#endif
