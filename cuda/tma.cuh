// hf_flashpatch: the Tensor Memory Accelerator (TMA, sm_90): tiles copied from global to shared memory by one
// instruction of one thread, completing on an mbarrier, and tiles of shared memory written to global memory
// (stored or reduce-added), tracked by the issuing thread's bulk async-groups. One concept: "how a tile moves between
// shared and global memory without the threads copying it"; which tiles move is the kernel's business.
//
// A copy is described by a tensor map (CUtensorMap, 128 opaque bytes) that the host encodes
// (hf_flashpatch/kernels/tma.py: cuTensorMapEncodeTiled) and passes by value as a __grid_constant__
// parameter (or inside the kernel's parameter struct). The maps this project encodes are rank 4. Q/K/V/dO:
// (columns, heads, rows, batch) with the columns contiguous, a (batch, rows, heads, columns) tensor or a varlen
// (tokens, heads, columns) one with a batch of 1; a box is 64 columns (128 bytes) x 1 head x `rows` rows x 1
// batch, written with the 128-byte swizzle: exactly one SW128 sub-tile of hopper.cuh (row r's 16-byte chunk c at
// c ^ (r % 8)), so a box lands where cp.async would have put it. Rows past the tensor's end are zero-filled. The
// backward's fp32 maps (its row statistics, its dQ workspace) are described in tma.py.
#pragma once
#include <stdint.h>

namespace hfp {

// A host-encoded tensor map, as the kernel receives it (the layout of CUtensorMap; 64-byte alignment is what
// the copy instructions require of it).
struct alignas(64) TmaDescriptor {
  uint64_t opaque[16];
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
namespace tma {

// Fetch the descriptor into the TMA unit's cache ahead of the first copy (a hint).
__device__ __forceinline__ void prefetch(const TmaDescriptor& desc) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&desc)) : "memory");
}

// Arrive on `bar` and add `bytes` to the transaction count its phase waits for: the phase completes once
// every expected arrival happened and that many bytes of copies naming `bar` have landed.
__device__ __forceinline__ void arrive_expect_bytes(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// Copy the box whose first element sits at coordinates (x0, x1, x2, x3) of `desc`'s tensor, in the map's dim
// order (the K/V/Q maps: column, head, row, batch), to shared address `dst` (1024-byte aligned for the swizzle,
// 128-byte without), signalling its bytes on `bar`.
__device__ __forceinline__ void load_box(uint32_t dst, const TmaDescriptor& desc, int x0, int x1, int x2, int x3,
                                         uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(&desc)), "r"(x0), "r"(x1), "r"(x2), "r"(x3), "r"(bar)
      : "memory");
}

// arrive_expect_bytes and load_box where `issue` holds: a predicate of the instruction, not a branch (as
// store_box_if), so that every lane of a warp may run the call with one of them issuing.
__device__ __forceinline__ void arrive_expect_bytes_if(bool issue, uint32_t bar, uint32_t bytes) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.u32 p, %2, 0;\n"
      " @p mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n}\n" ::"r"(bar),
      "r"(bytes), "r"(static_cast<uint32_t>(issue))
      : "memory");
}
__device__ __forceinline__ void load_box_if(bool issue, uint32_t dst, const TmaDescriptor& desc, int x0, int x1,
                                            int x2, int x3, uint32_t bar) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.u32 p, %7, 0;\n"
      " @p cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n}\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(&desc)), "r"(x0), "r"(x1), "r"(x2), "r"(x3), "r"(bar),
      "r"(static_cast<uint32_t>(issue))
      : "memory");
}

// load_box into shared address `dst` of every CTA of the cluster in `cta_mask` (bit r: rank r), signalling its
// bytes on the mbarrier at `bar` in each of them.
__device__ __forceinline__ void load_box_multicast(uint32_t dst, const TmaDescriptor& desc, int x0, int x1, int x2,
                                                   int x3, uint32_t bar, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(&desc)), "r"(x0), "r"(x1), "r"(x2), "r"(x3), "r"(bar), "h"(cta_mask)
      : "memory");
}

// Add the fp32 box at (column, row, head, batch) of `desc`'s tensor, read from shared address `src` (1024-byte
// aligned, the map's 128-byte swizzle), into global memory; part of this thread's current bulk async-group.
__device__ __forceinline__ void reduce_add_box(const TmaDescriptor& desc, uint32_t src, int column, int row, int head,
                                               int batch) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(
          reinterpret_cast<uint64_t>(&desc)),
      "r"(column), "r"(row), "r"(head), "r"(batch), "r"(src)
      : "memory");
}
// Store the 16-bit box at (x0, x1, x2, x3) of `desc`'s tensor (its dim order, as load_box) from shared address `src`
// (1024-byte aligned, the map's 128-byte swizzle), where `issue` holds; rows past the tensor's end are not written.
// Part of this thread's current bulk async-group; the shared memory is read asynchronously (fence_proxy_async_shared
// first). The condition is a predicate of the instruction, not a branch: every lane of a warp may run the call
// with one of them issuing, and no lane-dependent region enters the work loop (a per-warp test in the forward's
// epilogue made ptxas move the key loop's wgmma descriptors out of uniform registers).
__device__ __forceinline__ void store_box_if(bool issue, const TmaDescriptor& desc, uint32_t src, int x0, int x1,
                                             int x2, int x3) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.u32 p, %6, 0;\n"
      " @p cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n}\n" ::"l"(
          reinterpret_cast<uint64_t>(&desc)),
      "r"(x0), "r"(x1), "r"(x2), "r"(x3), "r"(src), "r"(static_cast<uint32_t>(issue))
      : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// This thread's bulk groups but the newest kPending have read their shared memory (it may be rewritten).
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace tma
#endif

}  // namespace hfp
