// hf_flashpatch: the Hopper forward's chained walk (CHAINED_WALK): one key loop over the key tiles of every work a
// math warpgroup walks, so that a work's first S = Q K^T runs beside the work before's last O += P V and its softmax
// beside that product: no step of a walk waits on the tensor cores with nothing else issued (the per-work loop,
// key_loop, has a first S with no P V beside it and a last P V alone at every work).
// Layouts as in fwd_hopper_ws.cu: q (B, S_q, H, D), k/v (B, S_k, H_kv, D), out (B, S_q, H, D), SW128 shared tiles.
// Unmasked batched problems whose output leaves by TMA boxes (the launch passes o_box_heads > 0): the finished work's
// rows are staged in its own Q tile, which its last S no longer reads, and stored by one lane's predicated box store,
// so the loop holds no branch that depends on the lane (one made ptxas keep the loop's indices per thread and send
// every wgmma descriptor through R2UR). Q comes in two tiles: each warp's first lane loads its 16 rows of the next
// work's Q into the other tile by TMA boxes of the output boxes' geometry (the launch passes that map as q_tma), once
// its boxes there were read; the warpgroup's "Q landed" mbarrier of that tile counts its four warps. The walk's first
// work's rows are copied (cp.async).
#pragma once
#include "fwd_hopper_step.cuh"
#include "fwd_split_tail.cuh"

namespace {

constexpr bool kChainedWalk = CHAINED_WALK != 0;
static_assert(!kChainedWalk || (!kWindowed && !Q_BY_TMA && !OWN_KEY_TILES && !STAGED_OUTPUT && TMA_OUTPUT &&
                                HEAD_DIM == HEAD_DIM_V && BLOCK_N >= 128 && !WARPGROUP_TURNS),
              "the chained walk: unmasked, the math warps copying Q, every key tile, the output by boxes, O's rescale "
              "under S, no warpgroup turns (the chain takes none)");

// Work tile `round` of this CTA's unmasked walk (rounds of gridDim.x tiles, no snake, no leading rows).
__device__ __forceinline__ hfp::fwd::QueryTile chain_work(const hfp::fwd::FwdParams& p, int round) {
  return hfp::fwd::query_tile<false, kBlockM, BLOCK_N>(p, hfp::fwd::persistent_work<kBlockM>(p, hfp::fwd::walk_work<false>(round)));
}

// Copy this warp's 16 rows (warp_row0..) of the work's packed Q tile into Q tile `q_tile` with cp.async (one group);
// rows past the sequence's packed rows are zero-filled.
__device__ __forceinline__ void copy_warp_query_rows(uint32_t q_tile, const hfp::fwd::FwdParams& p,
                                                     const hfp::fwd::QueryTile& tile, int warp_row0, int lane) {
  hfp::fwd::for_each_packed_chunk<HEAD_DIM, 16, 32>(
      lane, tile.p0 + warp_row0, tile.packed_rows, tile.group, [&](int row, int col, int pos, int head, bool valid) {
        const Elem* src = tile.q_rows + (valid ? pos * p.q_seq_stride + head * p.q_head_stride + col : 0);
        hfp::cp_async_16(q_tile + (col / 64) * (kBlockM * kSubTileRowBytes) +
                             hfp::sm90::sw128_offset(warp_row0 + row, (col % 64) / 8),
                         src, valid);
      });
  hfp::cp_async_commit();
}

// A finished work's epilogue, for one warp: normalise, stage its 16 rows in `staging` (its rows of the work's Q tile,
// one 16-row SW128 sub-tile a 64 columns: an output box's layout), one lane's box store a 64 columns as a bulk group
// of its own, and each row's LSE by a predicated store. Rows past the sequence's end lie past the batched map's rows,
// which a box does not write.
__device__ __forceinline__ void store_output_boxes(float (&acc_o)[1][kOT][4], hfp::fwd::OnlineSoftmax<1> softmax,
                                                   const hfp::fwd::FwdParams& p, const hfp::fwd::QueryTile& tile,
                                                   int warp_row0, int lane, uint32_t staging) {
  const int group_shift = __ffs(tile.group) - 1;  // output boxes run where the group divides 16: a power of two
  constexpr int kBlockBytes = kBlockM * kSubTileRowBytes;  // a 64-column sub-tile of a Q tile
  const int g = lane >> 2, t = lane & 3;
  float inv_sum[1][2], row_lse[1][2];
  softmax.finalize(inv_sum, row_lse, p.scores.exp2_mul());
  hfp::sm90::stage_warp_rows<kBf16, HEAD_DIM_V, kBlockBytes>(staging, reinterpret_cast<const float(&)[kOT * 4]>(acc_o),
                                                             inv_sum[0][0], inv_sum[0][1], lane);
  hfp::sm90::fence_proxy_async_shared();  // the staged rows, for the TMA's reads
  __syncwarp();
  const int first = tile.p0 + warp_row0;  // a multiple of 16, so of the box's heads
#pragma unroll
  for (int sub = 0; sub < HEAD_DIM_V / 64; ++sub)
    hfp::tma::store_box_if(lane == 0, p.o_tma, staging + sub * kBlockBytes, sub * 64, tile.kv_head * tile.group,
                           first >> group_shift, tile.batch);
  hfp::tma::bulk_commit();  // every lane: the others' groups are empty
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int packed = first + h * 8 + g;
    const int pos = packed >> group_shift;
    const int head = packed - (pos << group_shift);
    float* const lse = p.lse + tile.batch * p.lse_batch_stride + (tile.kv_head * tile.group + head) * p.lse_head_stride +
                       tile.span.q_token0 + pos;
    if (t == 0 && packed < tile.packed_rows) *lse = row_lse[0][h];
  }
}

// A math warpgroup's walk over its whole works (with a split last round, SPLIT_TAIL and p.tail_parts > 0, those of
// the full rounds; the split round's pieces are the pieces entry's: walk_pieces). The ring (fwd_hopper_ws.cu):
// wait_keys(r) waits until ring tile r's K landed and returns its slot; release(bar) hands a slot back on its "empty"
// mbarrier at `bar` (and the cluster peer's); V's waits and both releases are the walk's own, on the mbarriers from
// v_full_bars / k_empty_bars / v_empty_bars (8 bytes a slot), so that their addresses and parity are computed ahead.
// Step j of the walk is ring tile j, key tile i of the current work. The walk's first step computes S(0) alone;
// every later step issues S(j), gives O the rescale of step j-1's softmax under it (key_loop's order), issues P(j-1)
// V(j-1), retires S(j) and exponentiates it while P V runs (a work's first tile starts a fresh softmax), and once P
// V retired, a work's first step stores the work before and zeroes O for this work's first P V. The next work's Q
// rows are loaded at the current work's second step (its first, if it has one key tile), once the boxes staged in
// that Q tile were read; the boxes' origin is computed at the work's start (computed in the step, ptxas reordered
// the steady softmax: results/2026-12-06_chain-pingpong). q_landed: this warpgroup's "Q landed" mbarrier of Q tile
// 0; tile 1's lies 8 * NUM_WG bytes on.
// Every work sees a key tile, and at most heuristics.CHAINED_WALK_MAX_KEYS keys (heuristics.chained_walk_serves).
// ptxas placement (checked in the SASS): a peeled first step, not a P of zeros through the common step, and O zeroed
// rather than a runtime accumulate flag, keep the rescale under S without an injected wait (C7517); the never-taken
// branch that keeps the P V wait behind the exponentials sleeps rather than traps (a trap there serialised every
// wgmma and spilled). A steady step computes its V wait's barrier and parity, its K release's barrier and its
// key-length test beside S's issue, held there by an empty asm, and one test (`boundary`) guards the work's store
// and the next Q's load: left to ptxas, each was computed after the S or P V wait it follows, in the warp's exposed
// path (the steady path's static stalls: results/2026-12-06_chain-step).
template <typename WaitKeys, typename Release>
__device__ __forceinline__ void chained_walk(const hfp::fwd::FwdParams& p, uint32_t q_tiles,
                                             const OperandDescriptors& desc, int warp_row0, int lane,
                                             int q_rows_barrier, uint32_t q_landed, uint32_t v_full_bars,
                                             uint32_t k_empty_bars, uint32_t v_empty_bars, WaitKeys wait_keys,
                                             Release release) {
  using namespace hfp::sm90;
  const int g = lane >> 2, t = lane & 3;
  const int num_work = hfp::fwd::whole_works<kSplitTail, kBlockM>(p);  // the whole works' indices lie below it
  auto has_work = [&](int round) { return hfp::fwd::walk_work<false>(round) < num_work; };  // work `round` of the walk
  if (!has_work(0)) return;
  if (p.o_box_heads <= 0) __trap();  // the launch passes the output map (forward.py); no other store is built here
  auto warp_rows_of = [&](int buffer) { return q_tiles + buffer * kQBytes + warp_row0 * kSubTileRowBytes; };
  // This warpgroup's 64 Q rows of the current work landed: every warp's copy, then visible to the tensor cores.
  auto query_rows_landed = [&]() {
    hfp::cp_async_wait<0>();
    fence_proxy_async_shared();
    named_barrier_sync(q_rows_barrier, 128);
  };
  int round = 0, buffer = 0;  // the current work and its Q tile
  hfp::fwd::QueryTile tile = chain_work(p, round);
  copy_warp_query_rows(q_tiles + buffer * kQBytes, p, tile, warp_row0, lane);
  query_rows_landed();

  MathRows rows;
  rows.init();
  float(&o_flat)[kOT * 4] = reinterpret_cast<float(&)[kOT * 4]>(rows.acc_o);
  uint32_t probs[BLOCK_N / 16][4];
  float correction[1][2];
  bool rescale_pending = false;
  float scores[1][kNT][4];
  float(&s_flat)[kNT * 4] = reinterpret_cast<float(&)[kNT * 4]>(scores);
  uint32_t ring = 0;  // this step's ring tile (unsigned: its slot and parity are a mask and a shift)
  int i = 0;          // this step's key tile within the current work
  auto values_barrier = [&](uint32_t r) { return v_full_bars + 8 * (r % KV_STAGES); };  // ring tile r's V
  auto values_parity = [&](uint32_t r) { return (r / KV_STAGES) & 1; };
  auto keys_released = [&](uint32_t r) { return k_empty_bars + 8 * (r % KV_STAGES); };  // ring tile r's K slot
  auto values_released = [&](uint32_t r) { return v_empty_bars + 8 * (r % KV_STAGES); };
  // Set at each work's start: the step that loads the next work's Q rows (-1: no next work), the next work's tile
  // and its Q boxes' origin (this warp's). A work's tile is computed once, here, and kept for its steps and its
  // store: each computation is a chain of integer divisions in the boundary, where no product runs beside it.
  int copy_step = -1;
  hfp::fwd::QueryTile next_tile = tile, done_tile = tile;  // the next work's; the work before's, until it is stored
  struct { int head0, position, batch; } next_box = {0, 0, 0};
  const int group_shift = __ffs(p.group) - 1;  // output boxes run where the group divides 16: a power of two
  auto start_work = [&]() {
    copy_step = has_work(round + 1) ? min(1, tile.keys.num_tiles - 1) : -1;
    if (copy_step >= 0) {
      next_tile = chain_work(p, round + 1);
      next_box = {next_tile.kv_head * next_tile.group, (next_tile.p0 + warp_row0) >> group_shift, next_tile.batch};
    }
  };
  start_work();
  hfp::fwd::OnlineSoftmax<1> finished;  // the work before's softmax, kept for its store
  auto key0_of_step = [&]() { return (tile.keys.n_block_max - 1 - i) * BLOCK_N; };
  auto step_is_masked = [&]() {  // the key-length bound
    const int key0 = key0_of_step();
    return key0 < tile.keys.mask_lo || key0 + BLOCK_N > tile.keys.mask_hi;
  };
  // Soft-cap, key-length mask (where `masked`) and online softmax of this step's scores.
  auto softmax_of_step = [&](bool masked) {
    if (p.scores.softcap_pre != 0.f) hfp::fwd::apply_softcap(scores, p.scores);
    if (masked)
      hfp::fwd::apply_mask<false>(scores, key0_of_step() + 2 * t, tile.p0 + warp_row0 + g, tile.group, tile.shifts,
                                  tile.span.seqlen_k);
    rescale_pending = rows.softmax.exponentiate(scores, correction, p.scores.exp2_mul());
  };
  // At the copy step: this warp's 16 rows of the next work's Q by the TMA, a box a 64 columns (first lane).
  auto load_next_query = [&]() {
    hfp::tma::bulk_wait_read<0>();  // the boxes staged in the other Q tile were read (only the first lane has any)
    const uint32_t landed = q_landed + (buffer ^ 1) * 8 * NUM_WG;
    hfp::tma::arrive_expect_bytes_if(lane == 0, landed, 16 * HEAD_DIM * 2);
#pragma unroll
    for (int sub = 0; sub < HEAD_DIM / 64; ++sub)
      hfp::tma::load_box_if(lane == 0, warp_rows_of(buffer ^ 1) + sub * (kBlockM * kSubTileRowBytes), p.q_tma,
                            sub * 64, next_box.head0, next_box.position, next_box.batch, landed);
  };
  // After a step: the next step's work.
  auto next_step = [&]() -> bool {
    hfp::pack_a_fragments<kBf16, BLOCK_N>(probs, scores[0]);
    ++ring;
    if (++i < tile.keys.num_tiles) return true;
    if (copy_step < 0) return false;  // no next work (start_work)
    ++round;
    buffer ^= 1;
    done_tile = tile;
    tile = next_tile;
    start_work();
    // Its Q rows landed: the four warps' boxes into this Q tile, whose barrier completes once a use (works 1, 3, ..
    // in tile 1, 2, 4, .. in tile 0; the first work's rows were copied).
    hfp::sm90::mbarrier_wait(q_landed + buffer * 8 * NUM_WG, ((round - 1) >> 1) & 1);
    i = 0;
    return true;
  };
  // The walk's first step: S alone.
  {
    const uint32_t k_slot = wait_keys(ring);
    fence_operands(s_flat);
    wgmma_fence();
    issue_scores(s_flat, desc.q_rows.plus(buffer * kQBytes), desc.k_ring.plus(k_slot * kKBytes));
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(s_flat);
    release(keys_released(ring));
    softmax_of_step(step_is_masked());
    if (i == copy_step) load_next_query();
  }
  bool more = next_step();
  while (more) {
    const bool first = i == 0;
    const bool boundary = first || i == copy_step;
    const uint32_t k_slot = wait_keys(ring);
    uint32_t v_barrier = values_barrier(ring - 1), v_parity = values_parity(ring - 1), masked = step_is_masked();
    uint32_t k_release = keys_released(ring);
    asm volatile("" : "+r"(v_barrier), "+r"(v_parity), "+r"(masked), "+r"(k_release));  // here, beside S's issue
    fence_operands(s_flat);
    fence_operands(o_flat);
    wgmma_fence();
    issue_scores(s_flat, desc.q_rows.plus(buffer * kQBytes), desc.k_ring.plus(k_slot * kKBytes));
    wgmma_commit();
    rows.softmax.rescale(rows.acc_o, correction, rescale_pending);  // under S, as in key_loop
    mbarrier_wait(v_barrier, v_parity);
    fence_operands(o_flat);
    wgmma_fence();
    issue_pv(o_flat, probs, desc.v_ring.plus((ring - 1) % KV_STAGES * kVBytes));
    wgmma_commit();
    wgmma_wait<1>();  // S retired; the P V may still run
    fence_operands(s_flat);
    release(k_release);
    if (first) {  // a fresh softmax for this work
      finished = rows.softmax;
      rows.softmax.init();
    }
    softmax_of_step(masked != 0);
    if (__any_sync(0xffffffffu, rows.softmax.row_sum[0][0] < 0.f || rows.softmax.row_sum[0][1] < 0.f))
      __nanosleep(1);  // never taken (keep_wait_behind's reason; see above)
    wgmma_wait<0>();
    fence_operands(o_flat);
    fence_operands(reinterpret_cast<uint32_t(&)[BLOCK_N / 4]>(probs));
    release(values_released(ring - 1));
    if (boundary) {
      if (first) {  // O holds the work before's rows, complete; this work's first P V adds to zeros
        store_output_boxes(rows.acc_o, finished, p, done_tile, warp_row0, lane, warp_rows_of(buffer ^ 1));
        hfp::zero_fragments(rows.acc_o);
      }
      if (i == copy_step) load_next_query();
    }
    more = next_step();
  }
  // The last work's last P V, and its output.
  rows.softmax.rescale(rows.acc_o, correction, rescale_pending);
  mbarrier_wait(values_barrier(ring - 1), values_parity(ring - 1));
  const uint32_t v_slot = (ring - 1) % KV_STAGES;
  fence_operands(o_flat);
  wgmma_fence();
  wgmma_rs_tb<HEAD_DIM_V, kBf16>(o_flat, probs[0], desc.v_ring.plus(v_slot * kVBytes).value(), 1);
#pragma unroll
  for (int kk = 1; kk < BLOCK_N / 16; ++kk)
    wgmma_rs_tb<HEAD_DIM_V, kBf16>(o_flat, probs[kk],
                                   desc.v_ring.plus(v_slot * kVBytes + kk * 16 * kSubTileRowBytes).value(), 1);
  wgmma_commit();
  wgmma_wait<0>();
  fence_operands(o_flat);
  release(values_released(ring - 1));
  store_output_boxes(rows.acc_o, rows.softmax, p, tile, warp_row0, lane, warp_rows_of(buffer));
}

// The split last round's pieces of one math warpgroup (the SPLIT_TAIL builds' pieces entry, fwd_hopper_ws.cu), each
// by key_loop (the work-by-work walk's loop), its rows in Q tile 0 (copied, then read by every S of the piece). A
// piece of a split work writes its part (write_part); a piece that is its work's only part, and once every piece ran
// each work whose last part this warp wrote (folded in part order), leave by boxes staged in this warp's rows of that
// tile. The ring starts at 0: wait_keys(r) / wait_values(r) wait until ring tile r's K / V landed and return its
// slot, release_keys(r) / release_values(r) hand them back. key_loop's never-taken branch sleeps (a trap spilled).
template <typename WaitKeys, typename WaitValues, typename ReleaseKeys, typename ReleaseValues>
__device__ __forceinline__ void walk_pieces(const hfp::fwd::FwdParams& p, uint32_t q_tiles,
                                            const OperandDescriptors& desc, int warp_row0, int lane,
                                            int q_rows_barrier, WaitKeys wait_keys,
                                            WaitValues wait_values, ReleaseKeys release_keys,
                                            ReleaseValues release_values) {
  using namespace hfp::sm90;
  const uint32_t staging = q_tiles + warp_row0 * kSubTileRowBytes;
  uint32_t ring = 0, folds = 0;  // bit k: this warp folds piece k's work
  int k = 0;
  MathRows rows;
  hfp::fwd::for_each_tail_piece<kBlockM, BLOCK_N, KV_CLUSTER>(p, [&](const hfp::fwd::QueryTile& piece) {
    hfp::tma::bulk_wait_read<0>();       // this warp's boxes staged in the tile were read (its first lane's)
    named_barrier_sync(q_rows_barrier, 128);  // and every warp of the warpgroup is past its products on the tile
    copy_warp_query_rows(q_tiles, p, piece, warp_row0, lane);
    hfp::cp_async_wait<0>();
    fence_proxy_async_shared();  // the copies, for the tensor cores' reads
    named_barrier_sync(q_rows_barrier, 128);
    rows.init();
    const uint32_t first = ring;
    key_loop<false, true>(
        rows, p, piece, piece.p0 + warp_row0 + (lane >> 2), lane & 3, desc.q_rows, desc.k_ring,
        desc.v_ring, [&](int i) { return wait_keys(first + i); }, [&](int i) { return wait_values(first + i); },
        [&](int i) { release_keys(first + i); }, [&](int i) { release_values(first + i); }, [] {}, [] {}, [] {},
        [] {});
    ring += piece.keys.num_tiles;
    if (piece.parts == 1) {
      store_output_boxes(rows.acc_o, rows.softmax, p, piece, warp_row0, lane, staging);
    } else if (hfp::fwd::write_part<kOT>(rows.acc_o, rows.softmax, p, piece, warp_row0 / 16, 4 * NUM_WG, lane)) {
      folds |= 1u << k;
    }
    ++k;
  });
  k = 0;
  hfp::fwd::for_each_tail_piece<kBlockM, BLOCK_N, KV_CLUSTER>(p, [&](const hfp::fwd::QueryTile& piece) {
    if ((folds >> k++) & 1) {
      hfp::fwd::fold_parts<kOT>(rows.acc_o, rows.softmax, p, piece, warp_row0 / 16, 4 * NUM_WG, lane);
      hfp::tma::bulk_wait_read<0>();  // the staging's last boxes were read
      store_output_boxes(rows.acc_o, rows.softmax, p, piece, warp_row0, lane, staging);
    }
  });
}

}  // namespace
