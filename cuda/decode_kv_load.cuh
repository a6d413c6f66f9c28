// hf_flashpatch: how the decode kernel moves one 16-key K/V tile from global to shared memory.
// One concept: the copy pattern and its memory-system hints; the attention math never sees it.
//
// Compile-time switches (all 0 = the original pattern, kept bit-for-bit as the default):
//   L2_PREFETCH      cp.async with the .L2::256B prefetch hint: the first 16-byte request to a
//                    256-byte K/V row makes L2 fetch the whole row, so DRAM sees full-row bursts
//                    even when the row's sectors are requested by different instructions.
//   COALESCED_LOADS  each copy instruction covers whole rows (32 lanes x 16 B = 512 consecutive
//                    bytes at D = 128: two full 256-byte rows) instead of one 32-byte sector of 16
//                    different rows; the L1/TEX pipe then handles 4 lines per instruction instead of 16.
//                    Row addresses come from the lane that located the key (a warp shuffle), so the
//                    page table / slot table is still read once per key.
#pragma once
#include <stdint.h>

#include "primitives.cuh"

#ifndef L2_PREFETCH
#define L2_PREFETCH 0
#endif
#ifndef COALESCED_LOADS
#define COALESCED_LOADS 0
#endif

namespace hfp {

// 16-byte global -> shared copy of K/V data (zero-fill when !valid), with the variant's L2 hint.
__device__ __forceinline__ void cp_async_16_kv(uint32_t smem, const void* gmem, bool valid) {
#if L2_PREFETCH
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(src_bytes));
#else
  cp_async_16(smem, gmem, valid);
#endif
}

// Ask L2 to fetch the 128-byte line holding `gmem` (no register result, no shared memory).
__device__ __forceinline__ void prefetch_l2(const void* gmem) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(gmem));
}

// A pointer held by lane `src_lane` (every lane of the warp must call this).
template <typename T>
__device__ __forceinline__ const T* shfl_pointer(const T* ptr, int src_lane) {
  const unsigned long long bits = reinterpret_cast<unsigned long long>(ptr);
  return reinterpret_cast<const T*>(__shfl_sync(0xffffffffu, bits, src_lane));
}

}  // namespace hfp
