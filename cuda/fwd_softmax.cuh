// hf_flashpatch forward: the online-softmax state of the query rows one thread holds, and the
// score transforms applied before it (soft-capping, causal / sliding-window / key-range masking).
//
// Fragment ownership (mma.sync m16n8k16 C layout, lane = 4 * g + t): in every 16-row m-tile a
// thread holds rows g and g + 8, columns 2t and 2t + 1 of every 8-column n-tile. Each thread
// therefore carries the state of 2 * MT rows; the 4 lanes of a quad share a row and combine their
// partial maxima with quad shuffles.
#pragma once
#include "primitives.cuh"
#include "score_scale.cuh"
#include "visibility.cuh"

namespace hfp {
namespace fwd {

constexpr float kNegInf = -__builtin_huge_valf();
constexpr float kLn2 = 0.6931471805599453f;

// Which keys a row sees (WindowShifts, row_key_range): cuda/visibility.cuh.

// Online softmax over the key tiles of 2 * MT rows, in base 2.
// Invariants after each tile, per row:
//   row_max: the largest raw score seen so far (already soft-capped), -inf if no key seen yet;
//   row_sum: this thread's partial sum of exp2(score * scale_log2 - row_max * scale_log2) over the
//            keys it holds (the quad's four partial sums add up to the row's denominator);
//   the output accumulator rows are scaled consistently with row_sum (unnormalised).
template <int MT>
struct OnlineSoftmax {
  float row_max[MT][2];
  float row_sum[MT][2];

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        row_max[mt][h] = kNegInf;
        row_sum[mt][h] = 0.f;
      }
    }
  }

  // scores: (MT, NT, 4) raw scores of one key tile, masked entries -inf. Overwrites them with the
  // unnormalised probabilities and rescales acc_o (MT, OT, 4) for the new running maxima.
  template <int NT, int OT>
  __device__ __forceinline__ void update(float (&scores)[MT][NT][4], float (&acc_o)[MT][OT][4], float scale_log2) {
    float correction[MT][2];
    const bool max_moved = exponentiate(scores, correction, scale_log2);
    rescale(acc_o, correction, max_moved);
  }

  // The first half of update(): new maxima, probabilities and sums; returns whether any of this
  // thread's maxima moved and the per-row factors the output accumulator still has to be scaled by.
  // Split out so a kernel can exponentiate while an asynchronous O += P V still owns acc_o.
  template <int NT>
  __device__ __forceinline__ bool exponentiate(float (&scores)[MT][NT][4], float (&correction)[MT][2],
                                               float scale_log2) {
    bool max_moved = false;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float tile_max = row_max[mt][h];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          tile_max = fmaxf(tile_max, fmaxf(scores[mt][nt][2 * h], scores[mt][nt][2 * h + 1]));
        }
        tile_max = quad_max(tile_max);
        max_moved |= tile_max != row_max[mt][h];
        // A row that has seen only masked keys keeps max -inf; subtracting 0 instead keeps
        // exp2(-inf - 0) = 0 and avoids (-inf) - (-inf) = NaN.
        const float max_scaled = tile_max == kNegInf ? 0.f : tile_max * scale_log2;
        correction[mt][h] = exp2f(row_max[mt][h] * scale_log2 - max_scaled);
        row_max[mt][h] = tile_max;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float p = exp2f(fmaf(scores[mt][nt][2 * h + e], scale_log2, -max_scaled));
            scores[mt][nt][2 * h + e] = p;
            sum += p;
          }
        }
        row_sum[mt][h] = fmaf(row_sum[mt][h], correction[mt][h], sum);
      }
    }
    return max_moved;
  }

  // The second half: scale the output rows by `correction`. Once the running maxima settle (most
  // tiles after the first few), every correction is exactly exp2(0) = 1: skip the rescale when no
  // row of the warp moved.
  template <int OT>
  __device__ __forceinline__ void rescale(float (&acc_o)[MT][OT][4], const float (&correction)[MT][2], bool max_moved) {
    if (__any_sync(0xffffffffu, max_moved)) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int ot = 0; ot < OT; ++ot)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc_o[mt][ot][e] *= correction[mt][e >> 1];
    }
  }

  // After the last tile: reduce the partial sums over the quad, and return per row the factor that
  // normalises the output (0 for rows that saw no key) and the natural-log LSE (-inf there).
  __device__ __forceinline__ void finalize(float (&inv_sum)[MT][2], float (&lse)[MT][2], float scale_log2) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float sum = quad_sum(row_sum[mt][h]);
        // sum != 0, not > 0: a NaN score (NaN in q or k) leaves sum NaN, and the row must come out NaN
        // (as in torch), not as a row that saw no key. The maxima ignore NaN (fmaxf), the sums do not.
        const bool seen = sum != 0.f;
        inv_sum[mt][h] = seen ? 1.f / sum : 0.f;
        lse[mt][h] = seen ? (row_max[mt][h] * scale_log2 + __log2f(sum)) * kLn2 : kNegInf;
      }
    }
  }
};

// Soft-capping (score_scale.cuh): score <- tanh(score * scale / softcap); the outer factor, with
// log2(e), is the exp2 multiplier the online softmax applies (ScoreScale::exp2_mul).
template <int MT, int NT>
__device__ __forceinline__ void apply_softcap(float (&scores)[MT][NT][4], const ScoreScale& scale) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) scores[mt][nt][e] = scale.capped(scores[mt][nt][e]);
}

// Set scores of invisible keys to -inf. key0: key index of this thread's first column in the tile
// (tile start + 2t); row0: packed row of this thread's first row (its rows are row0 + 16 * mt + 8 * h).
// The rows' key ranges are recomputed here rather than kept in registers across the key loop: only
// boundary tiles pay for them.
template <bool kWindowed, int MT, int NT>
__device__ __forceinline__ void apply_mask(float (&scores)[MT][NT][4], int key0, int row0, int group, WindowShifts w,
                                           int seqlen_k) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int packed = row0 + 16 * mt + 8 * h;
      const int pos = group == 1 ? packed : packed / group;  // MHA skips the integer division
      const RowKeyRange r = row_key_range<kWindowed>(pos, w, seqlen_k);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = key0 + nt * 8 + e;
          if (key < r.lo || key >= r.hi) scores[mt][nt][2 * h + e] = kNegInf;
        }
    }
}

}  // namespace fwd
}  // namespace hfp
