// hf_flashpatch forward: the two warp-level GEMMs of a key tile, S = Q K^T and O += P V, on
// mma.sync m16n8k16 fragments (layouts in primitives.cuh and fwd_tile_io.cuh).
#pragma once
#include "fwd_tile_io.cuh"
#include "primitives.cuh"

namespace hfp {
namespace fwd {

// Fragments of one k-step of S = Q K^T: A for each of the warp's m-tiles, B for pairs of n-tiles.
template <int MT, int NT>
struct QkStepFrags {
  uint32_t a[MT][4];
  uint32_t b[NT / 2][4];
};

template <int kHeadDim, int MT, int NT, typename T>
__device__ __forceinline__ void load_qk_step(QkStepFrags<MT, NT>& f, const T* smem_q, const T* smem_k, int warp_row0,
                                             int ks, int lane) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) load_a_frag<kHeadDim>(f.a[mt], smem_q, warp_row0 + mt * 16, ks * 16, lane);
#pragma unroll
  for (int np = 0; np < NT / 2; ++np) load_k_frag<kHeadDim>(f.b[np], smem_k, np * 16, ks * 16, lane);
}

template <bool kBf16, int MT, int NT>
__device__ __forceinline__ void mma_qk_step(float (&scores)[MT][NT][4], const uint32_t (&a)[MT][4],
                                            const uint32_t (&b)[NT / 2][4]) {
#pragma unroll
  for (int np = 0; np < NT / 2; ++np) {
    const uint32_t b_lo[2] = {b[np][0], b[np][1]}, b_hi[2] = {b[np][2], b[np][3]};
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      mma_16816<kBf16>(scores[mt][2 * np], a[mt], b_lo);
      mma_16816<kBf16>(scores[mt][2 * np + 1], a[mt], b_hi);
    }
  }
}

// S = Q K^T with Q read from shared memory: (MT, NT, 4) fp32 accumulators, zeroed here.
// The k-step loop stays rolled: fully unrolled, ptxas hoists every fragment load of the tile ahead
// of the MMAs and runs out of registers.
template <bool kBf16, int kHeadDim, int MT, int NT, typename T>
__device__ __forceinline__ void gemm_qk_smem(float (&scores)[MT][NT][4], const T* smem_q, const T* smem_k,
                                             int warp_row0, int lane) {
  zero_fragments(scores);
#pragma unroll 1
  for (int ks = 0; ks < kHeadDim / 16; ++ks) {
    QkStepFrags<MT, NT> step;
    load_qk_step<kHeadDim>(step, smem_q, smem_k, warp_row0, ks, lane);
    mma_qk_step<kBf16>(scores, step.a, step.b);
  }
}

// S = Q K^T with the warp's Q fragments held in registers (q_frag: (MT, k-steps, A fragment)).
template <bool kBf16, int kHeadDim, int MT, int NT, typename T>
__device__ __forceinline__ void gemm_qk_regs(float (&scores)[MT][NT][4], const uint32_t (&q_frag)[MT][kHeadDim / 16][4],
                                             const T* smem_k, int lane) {
  zero_fragments(scores);
#pragma unroll
  for (int ks = 0; ks < kHeadDim / 16; ++ks) {
    uint32_t a[MT][4], b[NT / 2][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) a[mt][e] = q_frag[mt][ks][e];
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) load_k_frag<kHeadDim>(b[np], smem_k, np * 16, ks * 16, lane);
    mma_qk_step<kBf16>(scores, a, b);
  }
}

// O += P V: P (MT, NT, 4) are the probabilities in the S accumulator layout. Two adjacent 8-key
// n-tiles of S are exactly one 16-key A fragment of m16n8k16, so P is converted to bf16/fp16 pairs
// in registers and never touches shared memory.
template <bool kBf16, int kHeadDim, int MT, int NT, typename T>
__device__ __forceinline__ void gemm_pv(float (&acc_o)[MT][kHeadDim / 8][4], const float (&probs)[MT][NT][4],
                                        const T* smem_v, int lane) {
  using Traits = ElemTraits<kBf16>;
#pragma unroll
  for (int ks = 0; ks < NT / 2; ++ks) {
    uint32_t p[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      p[mt][0] = Traits::pack2(probs[mt][2 * ks][0], probs[mt][2 * ks][1]);          // row g,     keys 2t..
      p[mt][1] = Traits::pack2(probs[mt][2 * ks][2], probs[mt][2 * ks][3]);          // row g + 8, keys 2t..
      p[mt][2] = Traits::pack2(probs[mt][2 * ks + 1][0], probs[mt][2 * ks + 1][1]);  // row g,     keys 2t + 8..
      p[mt][3] = Traits::pack2(probs[mt][2 * ks + 1][2], probs[mt][2 * ks + 1][3]);  // row g + 8, keys 2t + 8..
    }
#pragma unroll
    for (int op = 0; op < kHeadDim / 16; ++op) {
      uint32_t b[4];
      load_v_frag<kHeadDim>(b, smem_v, ks * 16, op * 16, lane);
      const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_16816<kBf16>(acc_o[mt][2 * op], p[mt], b_lo);
        mma_16816<kBf16>(acc_o[mt][2 * op + 1], p[mt], b_hi);
      }
    }
  }
}

}  // namespace fwd
}  // namespace hfp
