// hf_flashpatch forward: what both forward bodies (fwd.cu, fwd_hopper_ws.cu) share before
// its main loop: the element type, the kernel parameters, the rows of the sequence a CTA works on,
// and the key tiles one query tile can see. Layout: q (B, S_q, H, D), k/v (B, S_k, H_kv, D); varlen
// packs sequences along the token dim (batch strides unused) with cu_seqlens (num_seqs + 1,).
#pragma once
#include "fwd_softmax.cuh"
#include "primitives.cuh"
#include "tma.cuh"

#ifndef HEAD_DIM
#error "HEAD_DIM must be defined"
#endif

namespace {
// The element type of a build: bf16 with ELEM_BF16 = 1, else fp16.
using Traits = hfp::ElemTraits<ELEM_BF16 != 0>;
using Elem = Traits::T;
}  // namespace

namespace hfp {
namespace fwd {

// The forward kernels' parameters, passed as one __grid_constant__ struct (read in place from the
// kernel's parameter space). hf_flashpatch/kernels/sources.py reads the launch's packing from this
// declaration (fields in launch order; one type per declaration, no nested pointers). The tensor maps come
// first: their 64-byte alignment then costs no padding.
struct FwdParams {
  // K's and V's tensor maps (tma.cuh; boxes of 64 columns x BLOCK_N keys), Q's (boxes of 64 columns x
  // q_box_heads heads x 64 / q_box_heads rows: 64 packed rows; the chained walk's are 16 packed rows, a warp's, as
  // the output's) and the output's (64 columns x o_box_heads heads x 16 / o_box_heads rows: a warp's 16 packed
  // rows), read by the warp-specialised Hopper body; zero bytes for the others.
  TmaDescriptor k_tma, v_tma, q_tma, o_tma;
  const Elem* __restrict__ q;       // (B, S_q, H, D), varlen (T_q, H, D)
  const Elem* __restrict__ k;       // (B, S_k, H_kv, D), varlen (T_k, H_kv, D)
  const Elem* __restrict__ v;       // like k
  Elem* __restrict__ out;           // like q
  float* __restrict__ lse;          // (B, H, S_q), varlen (H, T_q)
  const int* __restrict__ cu_seqlens_q;  // varlen: (N + 1,); nullptr when batched
  const int* __restrict__ cu_seqlens_k;
  int64_t q_batch_stride, q_seq_stride, q_head_stride;  // in elements
  int64_t k_batch_stride, k_seq_stride, k_head_stride;
  int64_t v_batch_stride, v_seq_stride, v_head_stride;
  int64_t o_batch_stride, o_seq_stride, o_head_stride;
  int64_t lse_batch_stride, lse_head_stride;
  int seqlen_q, seqlen_k;  // batched: the lengths; varlen: the longest sequence (sizes the grid)
  int group;               // query heads per KV head
  int window_left, window_right;  // folded window (hf_flashpatch/kernels/__init__.py fold_window)
  ScoreScale scores;        // softmax scale and soft-cap (score_scale.cuh)
  int total_q, total_k;     // varlen: the rows of q / k (cu_seqlens are clamped into them)
  int kv_heads, num_seqs;   // the work tiles' other two axes (the persistent Hopper body walks them itself)
  int work_section;         // persistent Hopper body: pairs per section of its work order (0: pair-major)
  int q_box_heads;          // Hopper body: the heads of a q_tma box (the group); 0: the math warps copy Q
  int o_box_heads;          // Hopper body: the group when it divides 16 (output by o_tma); 0: stored by the threads
  // Masked Hopper walks: the rows by which a sequence's first query tile starts before it (p0 = m_block * kBlockM -
  // leading_rows, negative for m_block 0; heuristics.leading_rows: the last tile's shortfall in whole 64-row
  // warpgroups), so that the tile short of rows is the one that sees the fewest keys under a causal mask, not the
  // heaviest. Rows before the sequence (whole warpgroups, their Q rows zero) are computed over few key tiles or none
  // and never stored. 0 elsewhere, and with output boxes (a box at a negative row faults the TMA).
  int leading_rows;
  // The chained walk's split last round (SPLIT_TAIL builds, tail_parts > 0; fwd_split_tail.cuh): the most parts a
  // work of that round has (0: no split); each warp's part of a split work, (tail works, tail_parts, math warps,
  // values, 32 lanes) fp32; per (tail work, math warp) the parts written so far (zeroed by the launch). Last, so that
  // the other builds' parameter offsets stay as they were.
  int tail_parts;
  float* __restrict__ partials;
  int* __restrict__ part_counters;
  // Persistent walks: the host's list of each CTA's works (hf_flashpatch/kernels/work_list.py), nullptr for the
  // walk's rounds (walk_work). work_list[b] .. work_list[b + 1] - 1 index CTA b's works in
  // work_list[gridDim.x + 1 + i], each a work index of the pair-major order (persistent_work with work_section 0), in
  // the order the CTA walks them.
  const int* __restrict__ work_list;
};

// The rows of one sequence: token offsets of its first query and first key, and its lengths. Varlen:
// from cu_seqlens, clamped into the total_q / total_k rows passed (packed_span); batched: the
// batch's own rows (offset 0, the lengths passed).
struct SequenceSpan {
  int64_t q_token0, k_token0;
  int seqlen_q, seqlen_k;
};

__device__ __forceinline__ SequenceSpan sequence_span(const FwdParams& p, int batch) {
  SequenceSpan span{0, 0, p.seqlen_q, p.seqlen_k};
  if (p.cu_seqlens_q != nullptr) {
    const int2 span_q = packed_span(p.cu_seqlens_q, batch, p.total_q);
    const int2 span_k = packed_span(p.cu_seqlens_k, batch, p.total_k);
    span.q_token0 = span_q.x;
    span.k_token0 = span_k.x;
    span.seqlen_q = span_q.y;
    span.seqlen_k = span_k.y;
  }
  return span;
}

// The key tiles (kBlockN keys each) that the query tile of packed rows [p0, p0 + kBlockM) sees: the union
// of its rows' visible ranges, walked from tile n_block_max - 1 down to n_block_min. Tiles wholly inside
// [mask_lo, mask_hi), the keys every row of the tile sees, need no mask.
struct KeyTiles {
  int mask_lo;  // the largest row lo
  int mask_hi;  // the smallest row hi
  int n_block_min, n_block_max, num_tiles;
};

template <bool kWindowed, int kBlockM, int kBlockN>
__device__ __forceinline__ KeyTiles visible_key_tiles(int p0, int packed_rows, int group, WindowShifts shifts,
                                                      int seqlen_k) {
  const int pos_first = p0 / group;
  const int pos_last = (min(p0 + kBlockM, packed_rows) - 1) / group;
  const int key_lo = row_key_range<kWindowed>(pos_first, shifts, seqlen_k).lo;
  const int key_hi = row_key_range<kWindowed>(pos_last, shifts, seqlen_k).hi;
  const int mask_lo = kWindowed ? pos_last + shifts.lo : 0;
  const int mask_hi = row_key_range<kWindowed>(pos_first, shifts, seqlen_k).hi;
  const int n_block_min = key_lo / kBlockN;
  const int n_block_max = key_hi > key_lo ? (key_hi + kBlockN - 1) / kBlockN : n_block_min;
  return {mask_lo, mask_hi, n_block_min, n_block_max, n_block_max - n_block_min};
}

// A work tile (WorkCoords below): query tile m_block of a (kv head, batch) pair; its sequence's rows (span),
// the tile's kBlockM packed rows from p0 (negative in a sequence's first tile of a masked Hopper walk:
// FwdParams::leading_rows), and the key tiles its rows within the sequence see. Bottom-right alignment: query i sits
// at key i + seqlen_k - seqlen_q (shifts). A tile that starts past the sequence's packed rows is empty (the mma.sync
// body's CTA returns before any barrier; the persistent body skips it in every role).
struct QueryTile {
  int kv_head, batch;
  SequenceSpan span;
  int group, packed_rows, p0;
  WindowShifts shifts;
  KeyTiles keys;
  // (B, S, H, D) rows of the pair: Q's first row of head kv_head * group, K's and V's of kv_head
  const Elem* q_rows;
  const Elem* k_rows;
  const Elem* v_rows;
  // A piece of a work of the split last round (tail_piece): part `part` of `parts` (1: the whole work), of tail work
  // `tail_work` (its index in that round).
  int tail_work, part, parts;
  __device__ __forceinline__ bool empty() const { return p0 >= packed_rows; }
};

// A work tile's coordinates: which kBlockM packed rows (m_block) of which KV head and sequence.
struct WorkCoords {
  int m_block, kv_head, batch;
};

// One CTA per work tile: grid (m blocks, kv heads, sequences); masked problems run the last m blocks (the
// ones that see the most keys) first.
template <bool kWindowed>
__device__ __forceinline__ WorkCoords block_work() {
  return {kWindowed ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x),
          static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.z)};
}

// The m blocks of the longest sequence (varlen: seqlen_q is the longest; a shorter sequence's tiles past its
// end are empty).
template <int kBlockM>
__device__ __forceinline__ int m_blocks(const FwdParams& p) {
  return (p.seqlen_q * p.group + kBlockM - 1) / kBlockM;
}

// Work tile `w` of a persistent grid; pairs (kv head, sequence) in grid order, kv head fastest.
// - work_section == 0: a pair's query tiles are consecutive, last (the ones that see the most keys when masked)
//   first, so the CTAs running at one time share a few pairs' K/V in L2 (as the one-CTA-per-tile grid's order did).
// - work_section == S > 0 (masked problems, heuristics.hopper_forward_schedule): sections of S pairs; within one,
//   the last query tile of each of its pairs, then the one before, ...: the tiles come in non-increasing weight,
//   which the snake walk (walk_work) deals out evenly, and the CTAs running at one time read S pairs' K/V.
template <int kBlockM>
__device__ __forceinline__ WorkCoords persistent_work(const FwdParams& p, int w) {
  const int count = m_blocks<kBlockM>(p);
  if (p.work_section == 0) {
    const int pair = w / count, m_rev = w - pair * count;
    return {count - 1 - m_rev, pair % p.kv_heads, pair / p.kv_heads};
  }
  const int per_section = p.work_section * count;
  const int section = w / per_section, in_section = w - section * per_section;
  const int first_pair = section * p.work_section;
  const int pairs_here = min(p.work_section, p.kv_heads * p.num_seqs - first_pair);  // the last section: fewer
  const int m_rev = in_section / pairs_here, pair = first_pair + (in_section - m_rev * pairs_here);
  return {count - 1 - m_rev, pair % p.kv_heads, pair / p.kv_heads};
}

// The work tile CTA blockIdx.x takes in round `round` (rounds of gridDim.x tiles): b, then, kSnake, every odd round
// in reverse (gridDim.x - 1 - b), so a CTA that took a heavy tile of a round takes a light one of the next.
// May be past the last tile in the last round (skipped by every role alike).
template <bool kSnake>
__device__ __forceinline__ int walk_work(int round) {
  const int b = static_cast<int>(blockIdx.x);
  return round * static_cast<int>(gridDim.x) + (kSnake && (round & 1) ? static_cast<int>(gridDim.x) - 1 - b : b);
}

// kLeadingRows: the sequence's first tile starts p.leading_rows before it (the masked Hopper walks).
template <bool kWindowed, int kBlockM, int kBlockN, bool kLeadingRows = false>
__device__ __forceinline__ QueryTile query_tile(const FwdParams& p, WorkCoords work) {
  const int m_block = work.m_block, kv_head = work.kv_head, batch = work.batch;
  QueryTile tile;
  tile.kv_head = kv_head;
  tile.batch = batch;
  tile.span = sequence_span(p, batch);
  tile.group = p.group;
  tile.packed_rows = tile.span.seqlen_q * p.group;
  tile.p0 = m_block * kBlockM - (kLeadingRows ? p.leading_rows : 0);
  tile.shifts = window_shifts(tile.span.seqlen_k - tile.span.seqlen_q, p.window_left, p.window_right);
  // From a negative p0, visible_key_tiles gives the tile's keys still: a row's key range starts at 0 or later, and
  // the tile's keys that need no mask shrink (mask_hi), so its few key tiles are all masked.
  tile.keys = visible_key_tiles<kWindowed, kBlockM, kBlockN>(tile.p0, tile.packed_rows, p.group, tile.shifts,
                                                             tile.span.seqlen_k);
  tile.q_rows = p.q + batch * p.q_batch_stride + tile.span.q_token0 * p.q_seq_stride +
                (int64_t)kv_head * p.group * p.q_head_stride;
  tile.k_rows = p.k + batch * p.k_batch_stride + tile.span.k_token0 * p.k_seq_stride + kv_head * p.k_head_stride;
  tile.v_rows = p.v + batch * p.v_batch_stride + tile.span.k_token0 * p.v_seq_stride + kv_head * p.v_head_stride;
  tile.tail_work = 0;
  tile.part = 0;
  tile.parts = 1;
  return tile;
}

// The split last round (p.tail_parts > 0: an unmasked fixed-length walk whose works do not fill the last round,
// heuristics.split_tail_parts): the walk's full rounds as before, then the last round's works cut by key tiles over
// the whole grid, so that no SM idles through that round's last works. The grid's kCluster-CTA clusters are its lanes
// (a cluster's CTAs take one group of kCluster works of a pair, the same key tiles); the last round's groups' key
// tiles, group after group and each work's in walk order, are shared out evenly, lane l taking positions
// [l U / L, (l + 1) U / L) of U; each group a lane's range meets is a piece: its CTA's work of the group, over the
// key tiles it meets (part `part` of the `parts` lanes that meet the group). hf_flashpatch/kernels/tail_split.py is
// the host's copy.
struct TailSplit {
  int full_rounds;   // rounds of gridDim.x works before the split one
  int tiles;         // key tiles per work
  int total;         // key tiles of the split round's groups (U)
  int lanes;         // L = min(gridDim.x / kCluster, U); clusters past the last lane have no piece
  // 32-bit: U is below gridDim.x x a work's key tiles (at most 52: the split serves up to 8192 keys,
  // heuristics.SPLIT_CHAIN_KEYS), so U x L stays far below 2^31 for a grid of one CTA per SM.
  __device__ __forceinline__ int start(int lane) const { return lane * total / lanes; }
  __device__ __forceinline__ int lane_of(int x) const { return ((x + 1) * lanes - 1) / total; }  // x's lane
};

template <int kBlockM, int kBlockN, int kCluster>
__device__ __forceinline__ TailSplit tail_split(const FwdParams& p) {
  const int num_work = m_blocks<kBlockM>(p) * p.kv_heads * p.num_seqs;
  const int grid = static_cast<int>(gridDim.x);
  const int full_rounds = num_work / grid;
  const int tiles = (p.seqlen_k + kBlockN - 1) / kBlockN;
  // Never more lanes than key tiles: each lane then has one at least, so the lanes meeting a group are consecutive.
  const int total = (num_work - full_rounds * grid) / kCluster * tiles;
  return {full_rounds, tiles, total, min(grid / kCluster, total)};
}

// This CTA's piece of group `group` over the round's positions [x0, x1) (within the group and this CTA's lane).
template <int kBlockM, int kBlockN, int kCluster>
__device__ __forceinline__ QueryTile tail_piece_at(const FwdParams& p, const TailSplit& split, int group, int x0,
                                                   int x1) {
  const int tail_work = group * kCluster + static_cast<int>(blockIdx.x) % kCluster;
  QueryTile tile = query_tile<false, kBlockM, kBlockN>(
      p, persistent_work<kBlockM>(p, split.full_rounds * static_cast<int>(gridDim.x) + tail_work));
  // Walk positions i0..i1 of the work's key tiles (walked from n_block_max - 1 down).
  const int i0 = x0 - group * split.tiles, i1 = x1 - group * split.tiles;
  tile.keys.n_block_min = tile.keys.n_block_max - i1;
  tile.keys.n_block_max -= i0;
  tile.keys.num_tiles = i1 - i0;
  const int first_lane = split.lane_of(group * split.tiles);
  tile.tail_work = tail_work;
  tile.part = static_cast<int>(blockIdx.x) / kCluster - first_lane;
  tile.parts = split.lane_of((group + 1) * split.tiles - 1) - first_lane + 1;
  return tile;
}

// This CTA's piece `k` (0, 1, ..) of the split round into `tile`; false past its last.
template <int kBlockM, int kBlockN, int kCluster>
__device__ __forceinline__ bool tail_piece(const FwdParams& p, const TailSplit& split, int k, QueryTile& tile) {
  const int lane = static_cast<int>(blockIdx.x) / kCluster;
  if (lane >= split.lanes) return false;
  const int begin = split.start(lane), end = split.start(lane + 1);
  const int group = begin / split.tiles + k;
  const int x0 = k == 0 ? begin : group * split.tiles;
  if (x0 >= end) return false;
  tile = tail_piece_at<kBlockM, kBlockN, kCluster>(p, split, group, x0, min(end, (group + 1) * split.tiles));
  return true;
}

// The works a walk takes whole, as work indices below the result: every one, or (kSplitTail builds, which the launch
// runs only with p.tail_parts > 0: forward._launch) those of its full rounds (the last round is split: the pieces
// entry's for_each_tail_piece). Not a test of p.tail_parts: with one, ptxas ordered the chained walk's steady
// softmax otherwise than without the split.
template <bool kSplitTail, int kBlockM>
__device__ __forceinline__ int whole_works(const FwdParams& p) {
  const int num_work = m_blocks<kBlockM>(p) * p.kv_heads * p.num_seqs;
  if constexpr (!kSplitTail) return num_work;
  return num_work / static_cast<int>(gridDim.x) * static_cast<int>(gridDim.x);
}

// This CTA's pieces of the split last round (p.tail_parts > 0), in order: `body(piece)` for each, a QueryTile over
// the key tiles it takes (tail_piece_at).
template <int kBlockM, int kBlockN, int kCluster, typename Body>
__device__ __forceinline__ void for_each_tail_piece(const FwdParams& p, Body body) {
  const TailSplit tail = tail_split<kBlockM, kBlockN, kCluster>(p);
  const int lane = static_cast<int>(blockIdx.x) / kCluster, end = tail.start(lane + 1);
  for (int x = lane < tail.lanes ? tail.start(lane) : end; x < end;) {  // this lane's positions, a piece a group
    const int group = x / tail.tiles, x1 = min(end, (group + 1) * tail.tiles);
    body(tail_piece_at<kBlockM, kBlockN, kCluster>(p, tail, group, x, x1));
    x = x1;
  }
}

// A persistent CTA's walk over its works, one at a time: the host's list (p.work_list) or the walk's rounds (masked:
// the snake's): next_index gives each work's index in turn (past the work count: a last round's missing work), and
// tile_of decodes it. The list's next index is read one work ahead.
template <bool kWindowed, int kBlockM, int kBlockN>
struct WorkWalk {
  const int* listed;
  int num_work, i, end, next;
  __device__ __forceinline__ explicit WorkWalk(const FwdParams& p) {
    num_work = m_blocks<kBlockM>(p) * p.kv_heads * p.num_seqs;
    const int grid = static_cast<int>(gridDim.x), b = static_cast<int>(blockIdx.x);
    listed = p.work_list;
    end = listed != nullptr ? listed[b + 1] : (num_work + grid - 1) / grid;
    i = listed != nullptr ? listed[b] : 0;
    next = listed != nullptr ? (i < end ? listed[grid + 1 + i] : num_work) : walk_work<kWindowed>(0);
  }
  // The walk's next work index into w (past the last work in a last round it does not fill), false past the walk.
  __device__ __forceinline__ bool next_index(int& w) {
    if (i >= end) return false;
    w = next;
    if (i + 1 < end)
      next = listed != nullptr ? listed[static_cast<int>(gridDim.x) + 2 + i] : walk_work<kWindowed>(i + 1);
    ++i;
    return true;
  }
  __device__ __forceinline__ QueryTile tile_of(const FwdParams& p, int w) const {
    return query_tile<kWindowed, kBlockM, kBlockN, kWindowed>(p, persistent_work<kBlockM>(p, w));
  }
};

// Every work of the CTA's walk (WorkWalk), in order: body(tile). kSplitTail builds (unmasked): where
// p.tail_parts > 0, the full rounds only (the pieces of the split one are the pieces entry's: for_each_tail_piece).
// Their walk is its own loop, so the other builds' code is unchanged.
template <bool kWindowed, int kBlockM, int kBlockN, bool kSplitTail = false, typename Body>
__device__ __forceinline__ void for_each_work(const FwdParams& p, Body body) {
  if constexpr (kSplitTail && !kWindowed) {
    const int grid = static_cast<int>(gridDim.x), walked = whole_works<true, kBlockM>(p);
    for (int w = static_cast<int>(blockIdx.x); w < walked; w += grid) {  // walk_work<false>: round r's is r grid + b
      const QueryTile tile = query_tile<false, kBlockM, kBlockN>(p, persistent_work<kBlockM>(p, w));
      if (!tile.empty()) body(tile);
    }
  } else {
    WorkWalk<kWindowed, kBlockM, kBlockN> walk(p);
    for (int w; walk.next_index(w);) {
      if (w >= walk.num_work) continue;
      const QueryTile tile = walk.tile_of(p, w);
      if (!tile.empty()) body(tile);
    }
  }
}

// The key tiles that the kRows packed rows of `tile` from `first_row` see: visible_key_tiles of those rows alone,
// a sub-range of the tile's (a row's first and last visible key never decrease with its position). Every score
// of the tile's other key tiles is masked for these rows, so a math warpgroup of the Hopper body may skip them:
// they move no maximum (computed, one below a window could still move a row's sum by an fp32 ulp, the online
// softmax's correction being 1 only to within a product's rounding: notes/forward.md, "Leading rows"). Rows wholly
// past the sequence: no tile. A masked walk's leading rows (wholly before it) get the key tiles of the positions
// their division by the group rounds to (none at group 1 and seqlen_k = seqlen_q, else a few), computed into rows
// nobody stores.
template <bool kWindowed, int kRows, int kBlockN>
__device__ __forceinline__ KeyTiles row_key_tiles(const QueryTile& tile, int first_row) {
  if (first_row >= tile.packed_rows) return {0, 0, tile.keys.n_block_min, tile.keys.n_block_min, 0};
  return visible_key_tiles<kWindowed, kRows, kBlockN>(first_row, tile.packed_rows, tile.group, tile.shifts,
                                                      tile.span.seqlen_k);
}

// The output rows of the tile's pair, like QueryTile::q_rows.
__device__ __forceinline__ Elem* out_rows(const FwdParams& p, const QueryTile& tile) {
  return p.out + tile.batch * p.o_batch_stride + tile.span.q_token0 * p.o_seq_stride +
         (int64_t)tile.kv_head * tile.group * p.o_head_stride;
}

}  // namespace fwd
}  // namespace hfp
