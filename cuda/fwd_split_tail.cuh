// hf_flashpatch forward: the parts of a split work meet (SPLIT_TAIL builds of the Hopper body).
// An unmasked walk whose works do not fill its last round cuts that round's works by key tiles over every CTA
// (tail_piece, fwd_geometry.cuh), so no SM idles while a few finish whole works. Each piece ends with a warp's 16 rows
// of unnormalised output and their online-softmax state, relative to the piece's own row maxima; the parts of a work
// meet here: every warp writes its part, and the warp that writes a work's last part folds all of them once its walk
// ended, in part order (the same sum whichever part came last), and stores the rows as an unsplit work's.
// Layouts: p.partials (tail works, p.tail_parts, math warps, values, 32 lanes) fp32, a value being one accumulator
// register of the mma C layout (fwd_softmax.cuh) or a row's maximum or partial sum, so that each lane reads back the
// columns it holds; p.part_counters (tail works, math warps) int, zeroed by the launch.
#pragma once
#include "fwd_geometry.cuh"

#ifndef SPLIT_TAIL
#define SPLIT_TAIL 0
#endif

namespace {
constexpr bool kSplitTail = SPLIT_TAIL != 0;
}  // namespace

namespace hfp {
namespace fwd {

// A warp's slot of part `part` of the tile's work (`warp` of `math_warps`; plus its lane: value v at v * 32).
template <int kOT>
__device__ __forceinline__ float* part_slot(const FwdParams& p, const QueryTile& tile, int part, int warp,
                                            int math_warps, int lane) {
  constexpr int kValues = kOT * 4 + 4;  // the accumulators, then row_max[0..1], row_sum[0..1]
  const int64_t slot = (static_cast<int64_t>(tile.tail_work) * p.tail_parts + part) * math_warps + warp;
  return p.partials + slot * (kValues * 32) + lane;
}

// For one warp after a piece's last P V: write its part (O unnormalised, the rows' maxima and this lane's partial
// sums) and count it; true where it was the work's last part, whose warp folds them (fold_parts). acc_o and softmax
// are only read, so that the chained walk's loop keeps them in their registers.
template <int kOT>
__device__ __forceinline__ bool write_part(const float (&acc_o)[1][kOT][4], const OnlineSoftmax<1>& softmax,
                                           const FwdParams& p, const QueryTile& tile, int warp, int math_warps,
                                           int lane) {
  float* const mine = part_slot<kOT>(p, tile, tile.part, warp, math_warps, lane);
#pragma unroll
  for (int v = 0; v < kOT * 4; ++v) __stcg(mine + v * 32, acc_o[0][v >> 2][v & 3]);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    __stcg(mine + (kOT * 4 + h) * 32, softmax.row_max[0][h]);
    __stcg(mine + (kOT * 4 + 2 + h) * 32, softmax.row_sum[0][h]);
  }
  __threadfence();  // this lane's part, before the count that announces it
  __syncwarp();
  int written = 0;
  if (lane == 0) written = atomicAdd(p.part_counters + tile.tail_work * math_warps + warp, 1);
  return __shfl_sync(0xffffffffu, written, 0) == tile.parts - 1;
}

// The warp that wrote a work's last part: every part, folded in part order (the same sum whichever part came last),
// into acc_o and softmax (unnormalised, relative to the rows' overall maxima), to be stored as an unsplit work's.
template <int kOT>
__device__ __forceinline__ void fold_parts(float (&acc_o)[1][kOT][4], OnlineSoftmax<1>& softmax, const FwdParams& p,
                                           const QueryTile& tile, int warp, int math_warps, int lane) {
  __threadfence();  // every part counted is written: read them from L2 (ld.cg), not a stale L1 line
  const float scale_log2 = p.scores.exp2_mul();
  float row_max[2] = {kNegInf, kNegInf};
  for (int part = 0; part < tile.parts; ++part) {
    const float* const slot = part_slot<kOT>(p, tile, part, warp, math_warps, lane);
#pragma unroll
    for (int h = 0; h < 2; ++h) row_max[h] = fmaxf(row_max[h], __ldcg(slot + (kOT * 4 + h) * 32));
  }
  float max_scaled[2], row_sum[2] = {0.f, 0.f};
#pragma unroll
  for (int h = 0; h < 2; ++h) max_scaled[h] = row_max[h] == kNegInf ? 0.f : row_max[h] * scale_log2;  // as exponentiate
  hfp::zero_fragments(acc_o);
  for (int part = 0; part < tile.parts; ++part) {
    const float* const slot = part_slot<kOT>(p, tile, part, warp, math_warps, lane);
    float factor[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      factor[h] = exp2f(__ldcg(slot + (kOT * 4 + h) * 32) * scale_log2 - max_scaled[h]);
      row_sum[h] = fmaf(__ldcg(slot + (kOT * 4 + 2 + h) * 32), factor[h], row_sum[h]);
    }
    // Register e of an 8-column block holds row h = e >> 1 (the C layout).
#pragma unroll
    for (int v = 0; v < kOT * 4; ++v)
      acc_o[0][v >> 2][v & 3] = fmaf(__ldcg(slot + v * 32), factor[(v & 3) >> 1], acc_o[0][v >> 2][v & 3]);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    softmax.row_max[0][h] = row_max[h];
    softmax.row_sum[0][h] = row_sum[h];
  }
}

}  // namespace fwd
}  // namespace hfp
