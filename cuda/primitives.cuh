// hf_flashpatch: device primitives shared by every kernel (Ampere+ PTX: cp.async, ldmatrix,
// mma.sync m16n8k16, warp reductions, bf16/fp16 packing). One concept: "how to talk to the
// hardware"; no attention logic lives here.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

namespace hfp {

// ---------------------------------------------------------------- element types
// ELEM_BF16 = 1 selects __nv_bfloat16, else __half. Kernels are compiled once per dtype.
template <bool kBf16>
struct ElemTraits {
  using T = std::conditional_t<kBf16, __nv_bfloat16, __half>;
  using T2 = std::conditional_t<kBf16, __nv_bfloat162, __half2>;
  static __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    T2 v;
    if constexpr (kBf16) v = __floats2bfloat162_rn(lo, hi);
    else v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ float2 unpack2(uint32_t u) {
    const T2 v = *reinterpret_cast<T2*>(&u);
    if constexpr (kBf16) return __bfloat1622float2(v);
    else return __half22float2(v);
  }
};

// ---------------------------------------------------------------- shared memory addressing
__device__ __forceinline__ uint32_t smem_addr(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// ---------------------------------------------------------------- register pressure
// %tid.x read afresh (volatile): the compiler cannot reuse an index it computed earlier, so the addresses
// derived from it are recomputed where they are used instead of living (or spilling) across a long loop.
__device__ __forceinline__ int fresh_thread_index() {
  int index;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(index));
  return index;
}
// One lane of a converged warp (the first), chosen by elect.sync: a predicate, so no lane index stays live for it.
__device__ __forceinline__ bool elect_one() {
  uint32_t elected;
  asm volatile(
      "{\n .reg .pred p;\n elect.sync _|p, 0xffffffff;\n selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(elected));
  return elected != 0;
}

// ---------------------------------------------------------------- cp.async (global -> shared)
// 16-byte copy that bypasses L1; when `valid` is false the 16 destination bytes are zero-filled,
// which is how out-of-range rows of a tile become harmless zeros instead of garbage.
__device__ __forceinline__ void cp_async_16(uint32_t smem, const void* gmem, bool valid) {
  int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// ---------------------------------------------------------------- ldmatrix (shared -> registers)
// x4: four 8x8 b16 matrices; thread t supplies the row address of row (t % 8) of matrix (t / 8).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem));
}

// ---------------------------------------------------------------- tensor-core MMA
// D(16x8, fp32) += A(16x16, row) * B(16x8, col), operands bf16 or fp16.
// Fragment layout (lane = 4*group + tid_in_group):
//   A: a[0]=(row g, cols 2t..2t+1), a[1]=(row g+8, ...), a[2]=(row g, cols 2t+8..), a[3]=(row g+8, cols 2t+8..)
//   B: b[0]=(rows 2t..2t+1, col g), b[1]=(rows 2t+8.., col g)
//   C/D: d[0..1]=(row g, cols 2t, 2t+1), d[2..3]=(row g+8, cols 2t, 2t+1)
// One asm statement for both input types: the PTX type name is the only difference.
#define HFP_MMA_16816(TYPE)                                                                          \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE ".f32 {%0,%1,%2,%3}, "        \
               "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                                          \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                     \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))
template <bool kBf16>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (kBf16) {
    HFP_MMA_16816("bf16");
  } else {
    HFP_MMA_16816("f16");
  }
}
#undef HFP_MMA_16816

// ---------------------------------------------------------------- accumulators
// Zero a warp's fp32 accumulator fragments: (m-tiles, n-tiles, the 4 values of an m16n8 C fragment).
template <int M, int N>
__device__ __forceinline__ void zero_fragments(float (&acc)[M][N][4]) {
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int n = 0; n < N; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[m][n][e] = 0.f;
}

// Accumulators (16 x N fp32, C layout) -> A fragments (16 x N, b16 pairs): the mma C layout is the A layout.
template <bool kBf16, int N>
__device__ __forceinline__ void pack_a_fragments(uint32_t (&a)[N / 16][4], const float (&acc)[N / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    a[kk][0] = ElemTraits<kBf16>::pack2(acc[2 * kk][0], acc[2 * kk][1]);
    a[kk][1] = ElemTraits<kBf16>::pack2(acc[2 * kk][2], acc[2 * kk][3]);
    a[kk][2] = ElemTraits<kBf16>::pack2(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
    a[kk][3] = ElemTraits<kBf16>::pack2(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
  }
}

// Two fp32 values to a shared-memory address (8-byte aligned).
__device__ __forceinline__ void st_shared_f32x2(uint32_t smem, float a, float b) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(smem), "f"(a), "f"(b) : "memory");
}

// ---------------------------------------------------------------- atomics
// Two adjacent fp32 values added atomically (a dQ accumulator pair). sm_90 has the vector reduction;
// earlier GPUs add the two floats one by one, which gives the same sums.
__device__ __forceinline__ void red_add_f32x2(float* dst, float a, float b) {
#if __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(dst), "f"(a), "f"(b));
#else
  atomicAdd(dst, a);
  atomicAdd(dst + 1, b);
#endif
}

// ---------------------------------------------------------------- warp reductions
// Reduce across the 4 lanes of an mma "quad" (lanes sharing a row of the C fragment).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffff, x, 1);
  return x + __shfl_xor_sync(0xffffffff, x, 2);
}

// log2(e): kernels work in base 2 (exp2f is one MUFU op) with scores pre-scaled by scale*log2(e).
constexpr float kLog2e = 1.4426950408889634f;

// ---------------------------------------------------------------- index tables
// Rows [x, x + y) of packed sequence b, from a (num_seqs + 1,) cu_seqlens table over a tensor of
// `total` rows. Both ends are clamped into [0, total] and the length to >= 0, so no table content
// can make a kernel touch a row outside the tensor. (Invalid tables are rejected on the host when
// the API's content checks run; unchecked, they give wrong rows, never an out-of-bounds access.)
__device__ __forceinline__ int2 packed_span(const int* cu, int b, int total) {
  const int begin = min(max(cu[b], 0), total);
  const int end = min(max(cu[b + 1], begin), total);
  return make_int2(begin, end - begin);
}

}  // namespace hfp
