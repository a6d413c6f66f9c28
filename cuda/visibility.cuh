// hf_flashpatch: which keys a query sees, for every kernel (forward, backward, decode). One definition
// of hf_flashpatch/reference/masks.py's semantics: bottom-right aligned (query i of seqlen_q sits at key
// i + offset, offset = seqlen_k - seqlen_q), a window of `left` keys before and `right` after that
// diagonal (-1: unbounded; causal is right = 0), and always keys < seqlen_k. Host and device code, so
// tests/test_visibility.py checks it on the CPU against the reference mask.
#pragma once

namespace hfp {

#define HFP_HOST_DEVICE __host__ __device__ __forceinline__

// The window as two shifts from a query's key position, so a row's key range costs two adds and a
// clamp. An unbounded side gets a shift of -+2^30, which the clamp to [0, seqlen_k] absorbs (positions
// stay far below 2^30, so nothing overflows).
struct WindowShifts {
  int lo;  // pos + lo = first visible key before clamping
  int hi;  // pos + hi = one past the last visible key before clamping
};

HFP_HOST_DEVICE WindowShifts window_shifts(int offset, int left, int right) {
  constexpr int kUnbounded = 1 << 30;
  return {left >= 0 ? offset - left : -kUnbounded, right >= 0 ? offset + right + 1 : kUnbounded};
}

// The keys [lo, hi) one query row sees.
struct RowKeyRange {
  int lo, hi;
};

// Query at key position pos (its index plus the shifts' offset folded in by window_shifts). kWindowed =
// false (no causal / window compiled in): every key below seqlen_k.
template <bool kWindowed>
HFP_HOST_DEVICE RowKeyRange row_key_range(int pos, WindowShifts w, int seqlen_k) {
  if constexpr (!kWindowed) return {0, seqlen_k};
  return {pos + w.lo > 0 ? pos + w.lo : 0, pos + w.hi < seqlen_k ? pos + w.hi : seqlen_k};
}

// Visibility over a (query, key) grid, in the terms the backward's tile loops ask: query i (of seqlen_q)
// sees key j iff i < seqlen_q and j is in row_key_range(i).
struct Visibility {
  int seqlen_q, seqlen_k;
  WindowShifts w;  // window_shifts(seqlen_k - seqlen_q, left, right)

  HFP_HOST_DEVICE bool visible(int i, int j) const {
    return i < seqlen_q && j < seqlen_k && j >= i + w.lo && j < i + w.hi;
  }
  // True when every (i, j) of the tile [m0, m1) x [n0, n1) is visible: the per-element test can be skipped.
  HFP_HOST_DEVICE bool tile_all_visible(int m0, int m1, int n0, int n1) const {
    return m1 <= seqlen_q && n1 <= seqlen_k && n1 - 1 < m0 + w.hi && n0 >= m1 - 1 + w.lo;
  }
  // Query rows [x, y) that see at least one key of [n0, n1).
  HFP_HOST_DEVICE int2 query_range(int n0, int n1) const {
    const int begin = n0 - w.hi + 1, end = n1 - w.lo;
    return make_int2(begin > 0 ? begin : 0, end < seqlen_q ? end : seqlen_q);
  }
  // Key columns [x, y) seen by at least one query of [m0, m1).
  HFP_HOST_DEVICE int2 key_range(int m0, int m1) const {
    const int begin = m0 + w.lo, end = m1 - 1 + w.hi;
    return make_int2(begin > 0 ? begin : 0, end < seqlen_k ? end : seqlen_k);
  }
};

HFP_HOST_DEVICE Visibility visibility(int seqlen_q, int seqlen_k, int left, int right) {
  return {seqlen_q, seqlen_k, window_shifts(seqlen_k - seqlen_q, left, right)};
}

}  // namespace hfp
