// hf_flashpatch: the parts of the Hopper forward kernel (fwd_hopper_ws.cu) that are not its warp roles: the
// shared-memory tiles, the K/V tile copy by threads, the math warpgroups' key-loop step and the epilogue.
// Compile-time configuration and layouts as described in fwd_hopper_ws.cu: q (B, S_q, H, D), k (B, S_k, H_kv, D), v (B, S_k, H_kv, D_v),
// out (B, S_q, H, D_v), SW128 shared tiles. D = HEAD_DIM, D_v = HEAD_DIM_V: equal (64 or 128), or
// multi-head latent attention's 192 / 128 (DeepSeek-V3).
#pragma once
#include "fwd_geometry.cuh"
#include "fwd_softmax.cuh"
#include "fwd_tile_io.cuh"
#include "hopper.cuh"
#include "primitives.cuh"

namespace {

#ifndef HEAD_DIM_V
#error "HEAD_DIM_V (v's head dim) comes from the build (hf_flashpatch/kernels/forward.py, ForwardConfig.build)"
#endif

constexpr bool kBf16 = ELEM_BF16 != 0;
constexpr bool kWindowed = HAS_MASK != 0;
constexpr int kMathThreads = 128 * NUM_WG;  // the warpgroups that own query rows
constexpr int kBlockM = 64 * NUM_WG;
constexpr int kNT = BLOCK_N / 8;                // 8-key column blocks of S
constexpr int kOT = HEAD_DIM_V / 8;             // 8-column blocks of O
constexpr int kSubTileRowBytes = hfp::sm90::kSwizzleRowBytes;
constexpr int kQBytes = kBlockM * HEAD_DIM * 2;
constexpr int kKBytes = BLOCK_N * HEAD_DIM * 2;    // one K tile
constexpr int kVBytes = BLOCK_N * HEAD_DIM_V * 2;  // one V tile
static_assert((HEAD_DIM == HEAD_DIM_V && (HEAD_DIM == 64 || HEAD_DIM == 128)) || (HEAD_DIM == 192 && HEAD_DIM_V == 128),
              "the wgmma forward serves head dims 64 and 128, and 192 with a v head dim of 128");
static_assert(BLOCK_N == 64 || BLOCK_N == 128 || BLOCK_N == 160, "S = Q K^T uses wgmma n64, n128 or n160");
#ifndef CHAINED_WALK
#define CHAINED_WALK 0
#endif
// CHAINED_WALK (fwd_hopper_chain.cuh): the next work's Q rows are copied into a second Q tile while this work runs.
constexpr int kQBuffers = CHAINED_WALK ? 2 : 1;

// The kernel's shared-memory tiles, from the 1024-byte aligned base (the swizzle atoms need
// it; the launch adds 1 KB of slack for rounding up): kQBuffers SW128 Q tiles (kBlockM, HEAD_DIM) (buffer b at
// q_tile + b * kQBytes), then the K ring of
// KV_STAGES SW128 (BLOCK_N, HEAD_DIM) tiles and the V ring of KV_STAGES (BLOCK_N, HEAD_DIM_V) tiles; `end` is
// where the kernel's own data (its mbarriers) follow. Ring slot s of K is at k_ring + s * kKBytes, of V at v_ring + s * kVBytes.
struct SharedTiles {
  uint32_t q_tile, k_ring, v_ring, end;
};

// Bytes the launch provides for those tiles: the atom of slack for rounding the base up, Q and both rings.
constexpr int kSharedTilesBytes = hfp::sm90::kSwizzleAtomBytes + kQBuffers * kQBytes + KV_STAGES * (kKBytes + kVBytes);

__device__ __forceinline__ SharedTiles shared_tiles(const unsigned char* smem_raw) {
  const uint32_t raw = hfp::smem_addr(smem_raw);
  const uint32_t base = (raw + hfp::sm90::kSwizzleAtomBytes - 1) & ~static_cast<uint32_t>(hfp::sm90::kSwizzleAtomBytes - 1);
  const uint32_t k_ring = base + kQBuffers * kQBytes;
  const uint32_t v_ring = k_ring + KV_STAGES * kKBytes;
  return {base, k_ring, v_ring, v_ring + KV_STAGES * kVBytes};
}

// Copy math warpgroup `warpgroup`'s 64 rows of the packed Q tile (rows 64 * warpgroup.. of the SW128 Q tile)
// with cp.async; rows at or beyond the sequence's packed rows, or (a masked walk's leading rows) before them, are
// zero-filled. tid: 0..127 within the warpgroup.
__device__ __forceinline__ void load_query_rows(const SharedTiles& smem, const hfp::fwd::FwdParams& p,
                                                const hfp::fwd::QueryTile& tile, int warpgroup, int tid) {
  const int row0 = 64 * warpgroup;
  const bool before = tile.p0 + row0 < 0;  // a masked walk's leading rows, in whole warpgroups
  hfp::fwd::for_each_packed_chunk<HEAD_DIM, 64, 128>(
      tid, tile.p0 + row0, tile.packed_rows, tile.group, [&](int row, int col, int pos, int head, bool valid) {
        if constexpr (kWindowed) valid = valid && !before;
        const Elem* src = tile.q_rows + (valid ? pos * p.q_seq_stride + head * p.q_head_stride + col : 0);
        hfp::cp_async_16(smem.q_tile + (col / 64) * (kBlockM * kSubTileRowBytes) +
                             hfp::sm90::sw128_offset(row0 + row, (col % 64) / 8),
                         src, valid);
      });
}

// S (64 x BLOCK_N per warpgroup) = Q K^T over the head dim: 16 elements (32 bytes) per k-step. q_rows /
// k_tile: descriptors of this warpgroup's first Q row and of the K tile's first row (SW128, K-major).
__device__ __forceinline__ void issue_scores(float (&s)[kNT * 4], hfp::sm90::SteppedDescriptor q_rows,
                                             hfp::sm90::SteppedDescriptor k_tile) {
#pragma unroll
  for (int ks = 0; ks < HEAD_DIM / 16; ++ks) {
    const uint32_t k_offset = (ks % 4) * 32;  // byte offset inside the sub-tile's 128-byte rows
    const uint64_t desc_q = q_rows.plus((ks / 4) * (kBlockM * kSubTileRowBytes) + k_offset).value();
    const uint64_t desc_k = k_tile.plus((ks / 4) * (BLOCK_N * kSubTileRowBytes) + k_offset).value();
    hfp::sm90::wgmma_ss<BLOCK_N, kBf16>(s, desc_q, desc_k, ks > 0);
  }
}

// O (64 x HEAD_DIM_V per warpgroup) += P V over the tile's keys: 16 keys (2048 bytes of V) per k-step. v_tile:
// the descriptor of the V tile's first row (SW128, read MN-major).
__device__ __forceinline__ void issue_pv(float (&o)[kOT * 4], const uint32_t (&p)[BLOCK_N / 16][4],
                                         hfp::sm90::SteppedDescriptor v_tile) {
#pragma unroll
  for (int kk = 0; kk < BLOCK_N / 16; ++kk)
    hfp::sm90::wgmma_rs_tb<HEAD_DIM_V, kBf16>(o, p[kk], v_tile.plus(kk * 16 * kSubTileRowBytes).value(), 1);
}

// The operand descriptors of a kernel, built once: this warpgroup's Q rows and the first slot of the K and
// V rings (slot s is `plus(s * kKBytes)` and `plus(s * kVBytes)`).
struct OperandDescriptors {
  hfp::sm90::SteppedDescriptor q_rows, k_ring, v_ring;
};

__device__ __forceinline__ OperandDescriptors operand_descriptors(const SharedTiles& smem, int warpgroup) {
  using hfp::sm90::SteppedDescriptor;
  constexpr uint32_t kAtom = hfp::sm90::kSwizzleAtomBytes;
  return {SteppedDescriptor::at(smem.q_tile + warpgroup * 64 * kSubTileRowBytes, 16, kAtom),
          SteppedDescriptor::at(smem.k_ring, 16, kAtom),
          SteppedDescriptor::at(smem.v_ring, BLOCK_N * kSubTileRowBytes, kAtom)};
}

// The state a math warpgroup's threads carry through the key loop (mma.sync C-fragment layout per warp):
// the unnormalised output rows and their online softmax.
struct MathRows {
  float acc_o[1][kOT][4];  // (1, O column blocks, C fragment)
  hfp::fwd::OnlineSoftmax<1> softmax;

  __device__ __forceinline__ void init() {
    hfp::zero_fragments(acc_o);
    softmax.init();
  }
};

// ptxas places a `wgmma.wait_group` as early as the registers it guards allow: the wait for P(i-1) V(i-1) went
// ahead of tile i's exponentials, which then ran after the product instead of under it. A branch on the row sums
// (which every exponential feeds; never taken, a sum of exponentials is not negative) ends the basic block, and
// ptxas does not move the wait above it. kSleep: the branch sleeps rather than traps (where a trap made ptxas
// serialise the wgmmas and spill: the chained walk's kernels).
template <bool kSleep = false>
__device__ __forceinline__ void keep_wait_behind(const float (&row_sum)[1][2]) {
  if (__any_sync(0xffffffffu, row_sum[0][0] < 0.f || row_sum[0][1] < 0.f)) {
    if constexpr (kSleep) {
      __nanosleep(1);
    } else {
      __trap();
    }
  }
}

// A math warpgroup's key loop over its 64 rows: per key tile S = Q K^T, soft-cap, mask (boundary tiles
// only), online softmax in base 2, O += P V, both products on wgmma. The softmax of tile i overlaps
// O += P(i-1) V(i-1) (FA3's intra-warpgroup overlap): S(i) is issued, O takes the rescale of tile i-1's softmax
// (kRescaleBeforePv), P(i-1) V(i-1) is issued, S(i) is retired first and exponentiated while P V still runs
// (keep_wait_behind; kSleep: its sleeping form), then P(i) is packed once P V retired (and O rescaled, on 64-key
// tiles). K and V of a ring slot are waited for and handed back apart: `wait_keys(i)` waits until tile i's K is in its slot and
// returns the slot (K at k_ring + slot * kKBytes), `wait_values(i)` until its V is (at v_ring + slot * kVBytes);
// `release_keys(i)` hands K back once S(i) retired, `release_values(i)` V once P(i) V(i) did; `release_queries()`
// runs once every S = Q K^T retired (at once without key tiles), `under_last_pv()` once the last P V was issued,
// before its wait (at once without key tiles): work that needs neither O nor the tensor cores, under the product
// that ends the work. `take_turn()` / `pass_turn()` bracket the issue of
// each product group (the walk's turns of the math warpgroups, WARPGROUP_TURNS; no-ops elsewhere): a loop over n
// key tiles takes n + 1 turns, one without tiles one. row: the packed row of this thread's first accumulator row
// (p0 + warp_row0 + g); t: lane % 4. Each product is its own wgmma group (fence, MMAs, commit); the operand
// fences keep the compiler from touching registers a wgmma owns between its issue and its wait.
template <bool kWindowed, bool kSleep = false, typename WaitKeys, typename WaitValues, typename ReleaseKeys,
          typename ReleaseValues, typename ReleaseQueries, typename UnderLastPv, typename TakeTurn, typename PassTurn>
__device__ __forceinline__ void key_loop(MathRows& rows, const hfp::fwd::FwdParams& p, const hfp::fwd::QueryTile& tile,
                                         int row, int t, hfp::sm90::SteppedDescriptor q_rows,
                                         hfp::sm90::SteppedDescriptor k_ring, hfp::sm90::SteppedDescriptor v_ring,
                                         WaitKeys wait_keys, WaitValues wait_values, ReleaseKeys release_keys,
                                         ReleaseValues release_values, ReleaseQueries release_queries,
                                         UnderLastPv under_last_pv, TakeTurn take_turn, PassTurn pass_turn) {
  using namespace hfp::sm90;
  // O's rescale for tile i-1 goes before P(i-1) V(i-1), under S(i) (FlashAttention-3's order), where a tile's P V is
  // long enough to pay for starting later; on 64-key tiles (192/128) it waits for P V to retire instead (decision
  // log in notes/forward.md).
  constexpr bool kRescaleBeforePv = BLOCK_N >= 128;
  const int num_tiles = tile.keys.num_tiles, n_block_max = tile.keys.n_block_max;
  if (num_tiles == 0) {  // one turn, as a loop over tiles takes num_tiles + 1
    take_turn();
    pass_turn();
    release_queries();
    under_last_pv();
    return;
  }
  float scores[1][kNT][4];
  float(&s_flat)[kNT * 4] = reinterpret_cast<float(&)[kNT * 4]>(scores);
  float(&o_flat)[kOT * 4] = reinterpret_cast<float(&)[kOT * 4]>(rows.acc_o);
  uint32_t probs[BLOCK_N / 16][4];
  float correction[1][2];
  auto softmax_of = [&](int i) -> bool {  // soft-cap, mask, exponentiate the scores of tile i
    const int key0 = (n_block_max - 1 - i) * BLOCK_N;
    if (p.scores.softcap_pre != 0.f) hfp::fwd::apply_softcap(scores, p.scores);
    if (key0 < tile.keys.mask_lo || key0 + BLOCK_N > tile.keys.mask_hi)
      hfp::fwd::apply_mask<kWindowed>(scores, key0 + 2 * t, row, tile.group, tile.shifts, tile.span.seqlen_k);
    return rows.softmax.exponentiate(scores, correction, p.scores.exp2_mul());
  };
  auto issue_scores_of = [&](uint32_t slot) {  // S = Q K(slot)^T as its own group
    fence_operands(s_flat);
    fence_operands(o_flat);
    wgmma_fence();
    issue_scores(s_flat, q_rows, k_ring.plus(slot * kKBytes));
    wgmma_commit();
  };
  auto issue_pv_of = [&](int i) {  // O += P(i) V(i) as its own group, once V(i) landed
    const uint32_t slot = wait_values(i);
    fence_operands(o_flat);
    wgmma_fence();
    issue_pv(o_flat, probs, v_ring.plus(slot * kVBytes));
    wgmma_commit();
  };
  auto retire_pv = [&](int i) {  // wait for O += P(i) V(i), then hand V(i) back
    wgmma_wait<0>();
    fence_operands(o_flat);
    fence_operands(reinterpret_cast<uint32_t(&)[BLOCK_N / 4]>(probs));
    release_values(i);
  };

  {
    const uint32_t slot = wait_keys(0);
    take_turn();
    issue_scores_of(slot);
    pass_turn();
  }
  wgmma_wait<0>();
  fence_operands(s_flat);
  release_keys(0);
  rows.softmax.rescale(rows.acc_o, correction, softmax_of(0));
  hfp::pack_a_fragments<kBf16, BLOCK_N>(probs, scores[0]);
  bool rescale_pending = false;  // kRescaleBeforePv: O still owes the rescale of the last softmax (before its P V)
  for (int i = 1; i < num_tiles; ++i) {
    const uint32_t slot = wait_keys(i);
    take_turn();
    issue_scores_of(slot);
    // O += P(i-1) V(i-1) after O's rescale for tile i-1, done here under S(i) (FlashAttention-3 rescales before
    // the product too), so that only P(i)'s packing follows the wait for the product.
    if constexpr (kRescaleBeforePv) rows.softmax.rescale(rows.acc_o, correction, rescale_pending);
    issue_pv_of(i - 1);
    pass_turn();
    wgmma_wait<1>();  // S(i) retired; P(i-1) V(i-1) may still run
    fence_operands(s_flat);
    release_keys(i);
    const bool max_moved = softmax_of(i);
    keep_wait_behind<kSleep>(rows.softmax.row_sum);
    retire_pv(i - 1);
    if constexpr (kRescaleBeforePv) {
      rescale_pending = max_moved;
    } else {
      rows.softmax.rescale(rows.acc_o, correction, max_moved);
    }
    hfp::pack_a_fragments<kBf16, BLOCK_N>(probs, scores[0]);
  }
  release_queries();  // every S retired; the last P V reads V and registers only
  if constexpr (kRescaleBeforePv) rows.softmax.rescale(rows.acc_o, correction, rescale_pending);
  take_turn();
  issue_pv_of(num_tiles - 1);
  pass_turn();
  under_last_pv();
  retire_pv(num_tiles - 1);
}

// This warp's rows by the TMA (store_output's kBoxes, the launch passed an output map), `first` its first packed row
// (p0 + warp_row0): O normalised by inv_sum and staged in `staging` (one 16-row SW128 sub-tile a 64 columns, the
// layout of an output box), then its first lane's box stores, one a 64 columns, as a bulk async-group of its own (the
// staging is rewritten only after it was read: bulk_wait_read). `first` is a multiple of 16, so of the box's heads
// (head 0 of a position).
// Rows past the sequence's end are past the batched map's rows, which a box does not write; the warp does not test
// for them (a branch on its rows made ptxas move the key loop's wgmma descriptors out of uniform registers). A box
// at a negative row faulted the TMA (an illegal instruction), so a launch with output boxes leads by no rows
// (FwdParams::leading_rows: forward.py).
__device__ __forceinline__ void store_boxes(MathRows& rows, const hfp::fwd::FwdParams& p,
                                            const hfp::fwd::QueryTile& tile, int first, int lane, uint32_t staging,
                                            const float (&inv_sum)[1][2]) {
  constexpr int kBlockBytes = kBlockM * kSubTileRowBytes;  // a 64-column sub-tile of the Q tile
  hfp::sm90::stage_warp_rows<kBf16, HEAD_DIM_V, kBlockBytes>(
      staging, reinterpret_cast<const float(&)[kOT * 4]>(rows.acc_o), inv_sum[0][0], inv_sum[0][1], lane);
  hfp::sm90::fence_proxy_async_shared();  // the staged rows, for the TMA's reads
  __syncwarp();
#pragma unroll
  for (int sub = 0; sub < HEAD_DIM_V / 64; ++sub)
    hfp::tma::store_box_if(lane == 0, p.o_tma, staging + sub * kBlockBytes, sub * 64, tile.kv_head * tile.group,
                           first / tile.group, tile.batch);
  hfp::tma::bulk_commit();  // every lane: the others' groups are empty
}

// A row's LSE, (B, H, S_q) or (H, T_q): head `head` of the tile's GQA group, position `pos` in its sequence.
__device__ __forceinline__ void store_row_lse(const hfp::fwd::FwdParams& p, const hfp::fwd::QueryTile& tile, int head,
                                              int pos, float lse) {
  p.lse[tile.batch * p.lse_batch_stride + (tile.kv_head * tile.group + head) * p.lse_head_stride +
        tile.span.q_token0 + pos] = lse;
}

// The epilogue each math thread runs on its own rows: normalise, write each row's LSE, and store the output.
// kStaged: through `staging`, this warp's 16 rows x HEAD_DIM_V in shared memory that its warpgroup no longer reads
// (its Q rows, once every S of the work retired), so that each row leaves in 16-byte stores (hopper.cuh,
// stage_warp_rows); kBoxes with `boxes` (the launch passed an output map: p.o_box_heads > 0): the warp stages its
// rows in its own Q rows (one 16-row SW128 sub-tile a 64 columns, the layout of an output box) and its first lane
// stores them with the TMA, one box a 64 columns, as a bulk async-group of its own (the warp's Q rows are rewritten
// only after it read them: bulk_wait_read); else straight from the accumulators (4 bytes per column pair; a warp's
// store covers 16 contiguous bytes of 8 rows). No barrier either way.
template <bool kStaged, bool kBoxes>
__device__ __forceinline__ void store_output(MathRows& rows, const hfp::fwd::FwdParams& p,
                                             const hfp::fwd::QueryTile& tile, int warp_row0, int lane,
                                             uint32_t staging, bool boxes) {
  const int g = lane >> 2, t = lane & 3;
  float inv_sum[1][2], row_lse[1][2];
  rows.softmax.finalize(inv_sum, row_lse, p.scores.exp2_mul());
  Elem* const out = hfp::fwd::out_rows(p, tile);  // (S_q, H, D_v) rows of the tile's GQA group
  auto row_of = [&](int packed, int& head) -> int {  // a packed row's position; its head within the group
    const int pos = tile.group == 1 ? packed : packed / tile.group;
    head = packed - pos * tile.group;
    return pos;
  };
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int packed = tile.p0 + warp_row0 + h * 8 + g;
    // Rows outside the sequence: at or past its end, or (a masked walk's leading rows) before it, one unsigned
    // compare; written out here and below (a helper function flipped the unmasked builds' compare and branch).
    if (kWindowed ? static_cast<unsigned>(packed) >= static_cast<unsigned>(tile.packed_rows)
                  : packed >= tile.packed_rows)
      continue;
    int head;
    const int pos = row_of(packed, head);
    if (!kStaged && !(kBoxes && boxes)) {
      Elem* const row = out + pos * p.o_seq_stride + head * p.o_head_stride + 2 * t;
#pragma unroll
      for (int ot = 0; ot < kOT; ++ot)
        *reinterpret_cast<uint32_t*>(row + ot * 8) =
            Traits::pack2(rows.acc_o[0][ot][2 * h] * inv_sum[0][h], rows.acc_o[0][ot][2 * h + 1] * inv_sum[0][h]);
    }
    if (t == 0) store_row_lse(p, tile, head, pos, row_lse[0][h]);
  }
  if constexpr (kStaged) {
    hfp::sm90::stage_warp_rows<kBf16, HEAD_DIM_V>(staging, reinterpret_cast<const float(&)[kOT * 4]>(rows.acc_o),
                                                  inv_sum[0][0], inv_sum[0][1], lane);
    __syncwarp();
    hfp::sm90::copy_warp_rows<HEAD_DIM_V>(staging, lane, [&](int r) -> void* {
      const int packed = tile.p0 + warp_row0 + r;
      if (kWindowed ? static_cast<unsigned>(packed) >= static_cast<unsigned>(tile.packed_rows)
                    : packed >= tile.packed_rows)
        return nullptr;
      int head;
      const int pos = row_of(packed, head);
      return out + pos * p.o_seq_stride + head * p.o_head_stride;
    });
  }
  if constexpr (kBoxes) {
    const int first = tile.p0 + warp_row0;
    if (boxes) store_boxes(rows, p, tile, first, lane, staging, inv_sum);
  }
}

// A masked walk's epilogue in two parts where its output leaves by boxes staged in a K slot (kKeySlotOutput,
// fwd_hopper_ws.cu): finish_rows under the work's last P V (the rows' normalisers from their final softmax state, and
// each row's LSE stored), then, once that product retired, store_boxes (store_output's boxes with those normalisers).
__device__ __forceinline__ void finish_rows(hfp::fwd::OnlineSoftmax<1>& softmax, const hfp::fwd::FwdParams& p,
                                            const hfp::fwd::QueryTile& tile, int warp_row0, int lane,
                                            float (&inv_sum)[1][2]) {
  const int g = lane >> 2, t = lane & 3;
  float row_lse[1][2];
  softmax.finalize(inv_sum, row_lse, p.scores.exp2_mul());
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int packed = tile.p0 + warp_row0 + h * 8 + g;
    if (kWindowed ? static_cast<unsigned>(packed) >= static_cast<unsigned>(tile.packed_rows)
                  : packed >= tile.packed_rows)
      continue;  // outside the sequence (store_output's test)
    const int pos = tile.group == 1 ? packed : packed / tile.group;
    if (t == 0) store_row_lse(p, tile, packed - pos * tile.group, pos, row_lse[0][h]);
  }
}

}  // namespace
