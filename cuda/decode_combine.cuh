// hf_flashpatch: the split-KV merge of the decode kernel (hfp_decode_combine in cuda/decode.cu).
// Layout: partial rows o_part (split, flat token, H, D_v) fp32 normalised per split, lse_part (split, flat
// token, H); out (B, S_q, H, D_v) or packed (T_q, H, D_v) in the input dtype, lse (B, H, S_q) fp32.
#pragma once
#include "decode_common.cuh"

namespace hfp {

// Merge num_splits partial (o, lse) rows: one warp per (flat token, head) output row.
__device__ __forceinline__ void decode_combine(const DecodeParams& p) {
  const int warp_global = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp_global >= p.total_q * p.heads) return;
  const int head = warp_global % p.heads, flat_tok = warp_global / p.heads;
  // Packed q: rows past the last sequence belong to no sequence (no partials were written).
  if (p.cu_seqlens_q != nullptr && flat_tok >= p.cu_seqlens_q[p.batch]) return;
  const int b = p.cu_seqlens_q ? 0 : flat_tok / p.seqlen_q;
  const long long split_stride = (long long)p.total_q * p.heads;
  const long long row0 = (long long)flat_tok * p.heads + head;
  float m = -INFINITY;
  for (int s = 0; s < p.num_splits; ++s) m = fmaxf(m, p.lse_part[row0 + s * split_stride]);
  const float base = m == -INFINITY ? 0.f : m;
  float weight_sum = 0.f;
  for (int s = 0; s < p.num_splits; ++s) weight_sum += __expf(p.lse_part[row0 + s * split_stride] - base);
  // weight_sum != 0, not > 0: a NaN partial lse (a NaN score) must give NaN, not "no key seen".
  const bool seen = weight_sum != 0.f;
  const float inv = seen ? 1.f / weight_sum : 0.f;
  // Batched form: flat_tok = b * S_q + tok; packed form: the batch stride is 0 and tok = flat_tok.
  const long long tok_in_row = p.cu_seqlens_q ? flat_tok : flat_tok % p.seqlen_q;
  Elem* dst = p.out + (long long)b * p.out_stride_b + tok_in_row * p.out_stride_s + (long long)head * p.out_stride_h;
  for (int d = lane * 2; d < kHeadDimV; d += 64) {
    float2 acc = make_float2(0.f, 0.f);
    for (int s = 0; s < p.num_splits; ++s) {
      const long long row = row0 + s * split_stride;
      const float w = __expf(p.lse_part[row] - base) * inv;
      const float2 o = *reinterpret_cast<const float2*>(p.o_part + row * kHeadDimV + d);
      acc.x += w * o.x, acc.y += w * o.y;
    }
    *reinterpret_cast<uint32_t*>(dst + d) = Traits::pack2(acc.x, acc.y);
  }
  if (lane == 0) {
    p.lse[(long long)b * p.lse_stride_b + (long long)head * p.lse_stride_h + tok_in_row * p.lse_stride_s] =
        seen ? base + __logf(weight_sum) : -INFINITY;
  }
}

}  // namespace hfp
