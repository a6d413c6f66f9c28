// hf_flashpatch: score scaling and soft-capping, the one definition for forward, backward and decode.
//
// A raw score s = q . k becomes the log2-domain logit that the kernels exponentiate with exp2:
//   uncapped:  s * scale_log2                          scale_log2   = softmax_scale * log2(e)
//   capped:    softcap_log2 * tanh(s * softcap_pre)    softcap_pre  = softmax_scale / softcap (0: no cap)
//                                                      softcap_log2 = softcap * log2(e)
// which is softcap * tanh(s * softmax_scale / softcap) in the natural-log domain. The host folds the
// three multipliers in one place (hf_flashpatch/kernels/__init__.py fold_scores). tanhf compiles to one
// MUFU.TANH instruction under the kernels' --use_fast_math (the same instruction as tanh.approx.f32).
#pragma once

namespace hfp {

struct ScoreScale {
  float scale_log2;
  float softcap_pre;
  float softcap_log2;

  // The multiplier into the exp2 domain of what capped() returns (or of the raw score, uncapped). The
  // forward applies it inside the online softmax's FMA, so it caps first and scales there.
  __device__ __forceinline__ float exp2_mul() const { return softcap_pre != 0.f ? softcap_log2 : scale_log2; }

  // A capped score before its outer factor: tanh(s * softmax_scale / softcap).
  __device__ __forceinline__ float capped(float s) const { return tanhf(s * softcap_pre); }

  // The log2-domain logit of raw score s; kCapped is a build's soft-cap switch.
  template <bool kCapped>
  __device__ __forceinline__ float logit2(float s) const {
    if constexpr (kCapped) {
      return capped(s) * softcap_log2;
    } else {
      return s * scale_log2;
    }
  }

  // The same, and (capped) dtanh = 1 - tanh^2, the chain-rule factor of the cap for the backward.
  template <bool kCapped>
  __device__ __forceinline__ float logit2(float s, float& dtanh) const {
    if constexpr (kCapped) {
      const float t = capped(s);
      dtanh = 1.f - t * t;
      return t * softcap_log2;
    } else {
      return s * scale_log2;
    }
  }
};

}  // namespace hfp
