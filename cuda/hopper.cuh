// hf_flashpatch: Hopper (sm_90a) device primitives: warpgroup MMA (wgmma) with shared-memory matrix
// descriptors over 128-byte-swizzled tiles. One concept: "how to talk to Hopper's tensor cores";
// attention logic lives in the kernels. Builds that include this file need the sm_90a target.
//
// Shared-memory tile format used with these descriptors ("SW128 tile"): a (rows, 64 x k) tile of
// 16-bit elements is stored as k sub-tiles of (rows, 64); each sub-tile row is 128 bytes, and 16-byte
// chunk c of row r sits at chunk position c ^ (r % 8). Eight rows form a 1024-byte swizzle atom, so
// every sub-tile must start 1024-byte aligned. The same bytes serve both operand orientations:
//   K-major (the reduction index runs along a row: Q and K in S = Q K^T): SBO = 1024 (next 8 rows),
//     LBO unused; the start address advances 32 bytes per 16-element k-step inside a sub-tile;
//   MN-major (the output index runs along a row: V in O = P V): LBO = bytes between sub-tiles
//     (next 64 output columns), SBO = 1024 (next 8 reduction rows); a 16-row k-step advances 2048 bytes.
#pragma once
#include <stdint.h>

#include "primitives.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "hopper.cuh needs the sm_90a target (-gencode=arch=compute_90a,code=sm_90a)"
#endif

namespace hfp {
namespace sm90 {

constexpr int kSwizzleRowBytes = 128;   // one sub-tile row: 64 16-bit elements
constexpr int kSwizzleAtomBytes = 1024;  // 8 rows: the period of the XOR pattern

// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` inside a SW128 sub-tile.
__device__ __forceinline__ uint32_t sw128_offset(int row, int chunk) {
  return row * kSwizzleRowBytes + ((chunk ^ (row & 7)) << 4);
}

// wgmma shared-memory matrix descriptor, 128-byte swizzle (bits: 0-13 address >> 4, 16-29 LBO >> 4,
// 32-45 SBO >> 4, 62-63 swizzle mode, 1 = 128 B). Base offset 0: atoms are 1024-byte aligned.
__device__ __forceinline__ uint64_t sw128_descriptor(uint32_t smem_address, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  uint64_t desc = (smem_address & 0x3FFFF) >> 4;
  desc |= static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16;
  desc |= static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFF) << 32;
  desc |= static_cast<uint64_t>(1) << 62;
  return desc;
}

// A SW128 descriptor built once and stepped by byte offsets inside the key loop. The address field is the
// low 14 bits (address >> 4) and every operand tile lies below 256 KB of shared memory, so no step
// carries out of it: descriptor(address + offset) = descriptor(address) + offset / 16, one 32-bit add
// on the low word (the high word, SBO and swizzle mode, never changes).
struct SteppedDescriptor {
  uint32_t lo, hi;
  __device__ __forceinline__ static SteppedDescriptor at(uint32_t smem_address, uint32_t lbo_bytes, uint32_t sbo_bytes) {
    const uint64_t desc = sw128_descriptor(smem_address, lbo_bytes, sbo_bytes);
    return {static_cast<uint32_t>(desc), static_cast<uint32_t>(desc >> 32)};
  }
  __device__ __forceinline__ SteppedDescriptor plus(uint32_t byte_offset) const { return {lo + (byte_offset >> 4), hi}; }
  // The descriptor of the tile byte_offset past this one's address, with leading byte offset lbo_bytes, this one
  // built with a leading offset of 0: the LBO field (bits 16-29) is still 0 and the address field does not carry
  // into it, so one add on the low word gives it and every tile of a kernel steps from one register.
  __device__ __forceinline__ SteppedDescriptor tile(uint32_t byte_offset, uint32_t lbo_bytes) const {
    return {lo + (byte_offset >> 4) + ((lbo_bytes >> 4) << 16), hi};
  }
  __device__ __forceinline__ uint64_t value() const { return (static_cast<uint64_t>(hi) << 32) | lo; }
  // The same descriptor as a value the compiler cannot see through: the descriptors derived from it inside a loop
  // are then not loop-invariant, so they are added where used rather than hoisted and held in registers.
  __device__ __forceinline__ SteppedDescriptor opaque() const {
    uint32_t fresh;
    asm volatile("mov.b32 %0, %1;\n" : "=r"(fresh) : "r"(lo));
    return {fresh, hi};
  }
};

// The warpgroup of this thread as a value the compiler knows is the same across the warp, so that what
// depends on it (a warpgroup's Q rows, their descriptors) lives in uniform registers.
__device__ __forceinline__ int uniform_warpgroup(int thread) { return __shfl_sync(0xffffffff, thread / 128, 0); }

// Order this thread's earlier generic-proxy shared-memory writes (plain stores, cp.async) before
// later async-proxy reads (wgmma operands); pair with a barrier across the writing threads.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// wgmma.fence: registers written by ordinary instructions (accumulators rescaled, A fragments
// packed) are visible to the next wgmma of this warpgroup.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Shared-memory mbarriers (one 8-byte word each): a phase completes when `count` arrivals happened;
// waiters name the phase parity they wait for (0 for the first completion, then 1, 0, ...).
__device__ __forceinline__ void mbarrier_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, int parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// Clusters (sm_90): CTAs launched together on one GPC that may write into each other's shared memory (a TMA
// multicast) and arrive on each other's mbarriers.
// This CTA's rank in its cluster.
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}
// Make this thread's mbarrier initialisations visible to the cluster (before the cluster barrier that publishes
// them).
__device__ __forceinline__ void fence_mbarrier_init_cluster() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// A barrier of every thread of every CTA of the cluster (also a barrier of this CTA's threads).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// Arrive on the mbarrier at this CTA's shared address `bar` in the shared memory of cluster CTA `rank`. The
// default CTA-scope release: what the arrival announces is that this warp's wgmma reads of a slot retired (its
// wait did that), not memory the other CTA reads, and a cluster-scope release costs a GPU-wide MEMBAR per arrival.
__device__ __forceinline__ void mbarrier_arrive_in(uint32_t bar, uint32_t rank) {
  asm volatile(
      "{\n.reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(bar),
      "r"(rank)
      : "memory");
}

// Per-warpgroup register budgets of warp-specialised kernels (the kernel needs a register cap at entry:
// __launch_bounds__(threads, 1)); every warp of the warpgroup must execute it.
template <int kRegisters>
__device__ __forceinline__ void registers_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void registers_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// Four 8 x 8 b16 matrices from registers to shared memory (the inverse of ldmatrix_x4): thread t holds row t / 4,
// columns 2 (t % 4) .. + 1 of matrix i in r[i] (the mma accumulator's fragment, packed), and lanes 8 i .. 8 i + 7
// give the addresses of matrix i's rows (16 bytes each).
__device__ __forceinline__ void stmatrix_x4(uint32_t smem, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
}

// A barrier among `threads` threads (a multiple of 32) on hardware barrier `id` (1..15; 0 is __syncthreads).
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Arrive on hardware barrier `id` without waiting: `threads` counts these arrivals and the threads that sync on it.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Zero rows [first_row, kRows) of a SW128 tile of kSubTiles 64-column sub-tiles (the swizzle permutes chunks
// within a row, so a row is 128 contiguous bytes of its sub-tile), by kThreads threads (tid).
template <int kRows, int kSubTiles, int kThreads>
__device__ __forceinline__ void zero_tile_rows(uint32_t tile, int first_row, int tid) {
  const int row_chunks = (kRows - first_row) * 8;  // 16-byte chunks per sub-tile
  for (int c = tid; c < row_chunks * kSubTiles; c += kThreads) {
    const int sub = c / row_chunks, rest = c - sub * row_chunks;
    const uint32_t addr = tile + sub * (kRows * kSwizzleRowBytes) + first_row * kSwizzleRowBytes + rest * 16;
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
  }
}

// Keep the compiler from moving reads or writes of wgmma accumulators across the asynchronous
// window (between issue and wait the hardware owns those registers).
template <int N>
__device__ __forceinline__ void fence_operands(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_operands(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// Accumulator layout of m64nNk16 (fp32): warp w of the warpgroup owns rows 16w..16w+15; for every
// 8-column block j the thread (lane = 4g + t) holds d[4j + 0, 1] = (row g, columns 8j + 2t, + 1) and
// d[4j + 2, 3] = (row g + 8, same columns): per warp, the mma.sync m16n8k16 C layout, block after block.
// A from registers uses, per warp, the mma.sync m16n8k16 A-fragment layout.
// Each wrapper is one asm statement, written once for both element types: its ISSUE(ab) macro takes the PTX type
// pair, "bf16.bf16" or "f16.f16"; HFP_ACCn lists n fp32 accumulators as in-out operands, HFP_REGSn their %0.. names.
#define HFP_ACC8(d, i) \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define HFP_ACC16(d) HFP_ACC8(d, 0), HFP_ACC8(d, 8)
#define HFP_ACC32(d) HFP_ACC16(d), HFP_ACC8(d, 16), HFP_ACC8(d, 24)
#define HFP_ACC64(d) HFP_ACC32(d), HFP_ACC8(d, 32), HFP_ACC8(d, 40), HFP_ACC8(d, 48), HFP_ACC8(d, 56)
#define HFP_REGS16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define HFP_REGS32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define HFP_REGS64 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define HFP_ACC80(d) HFP_ACC64(d), HFP_ACC8(d, 64), HFP_ACC8(d, 72)
#define HFP_REGS80 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79"
#define HFP_BOTH_TYPES(ISSUE) \
  if constexpr (kBf16) ISSUE("bf16.bf16"); \
  else ISSUE("f16.f16")

// D (64 x N, fp32) (+)= A (64 x 16, smem) * B (16 x N, smem), N = 32, 64, 128 or 160; kTransA / kTransB = 0: K-major
// operand (the reduction index runs along a stored row), 1: MN-major. accumulate = 0 ignores D's old value.
// HFP_WGMMA_SS: the statement for N with its accumulator list and the operand numbers of the predicate's source,
// the two descriptors and the two transposes.
#define HFP_WGMMA_SS(ab, n, regs, acc, p, a, b, ta, tb)                                                        \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #p ", 0;\n"                                                \
               "wgmma.mma_async.sync.aligned.m64n" #n "k16.f32." ab " {" regs "}, %" #a ", %" #b ", p, 1, 1, %" #ta \
               ", %" #tb ";\n}\n"                                                                               \
               : acc(d)                                                                                         \
               : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTransA), "n"(kTransB))
template <int N, bool kBf16, int kTransA = 0, int kTransB = 0>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  static_assert(N == 32 || N == 64 || N == 128 || N == 160, "wgmma_ss: n = 32, 64, 128 or 160");
#define ISSUE32(ab) HFP_WGMMA_SS(ab, 32, HFP_REGS16, HFP_ACC16, 18, 16, 17, 19, 20)
#define ISSUE64(ab) HFP_WGMMA_SS(ab, 64, HFP_REGS32, HFP_ACC32, 34, 32, 33, 35, 36)
#define ISSUE128(ab) HFP_WGMMA_SS(ab, 128, HFP_REGS64, HFP_ACC64, 66, 64, 65, 67, 68)
#define ISSUE160(ab) HFP_WGMMA_SS(ab, 160, HFP_REGS80, HFP_ACC80, 82, 80, 81, 83, 84)
  if constexpr (N == 32) { HFP_BOTH_TYPES(ISSUE32); }
  else if constexpr (N == 64) { HFP_BOTH_TYPES(ISSUE64); }
  else if constexpr (N == 128) { HFP_BOTH_TYPES(ISSUE128); }
  else { HFP_BOTH_TYPES(ISSUE160); }
#undef ISSUE32
#undef ISSUE64
#undef ISSUE128
#undef ISSUE160
}

// D (64 x N, fp32) += A (64 x 16, registers, mma.sync A-fragment layout per warp) * B (16 x N, smem, MN-major: the
// operand's N index is contiguous, hence imm-trans-b = 1), N = 64 or 128. HFP_WGMMA_RS as HFP_WGMMA_SS, with the
// operand numbers of the predicate's source, the four A registers and the descriptor.
#define HFP_WGMMA_RS(ab, n, regs, acc, p, a0, a1, a2, a3, b)                                                    \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #p ", 0;\n"                                                \
               "wgmma.mma_async.sync.aligned.m64n" #n "k16.f32." ab " {" regs "}, {%" #a0 ", %" #a1 ", %" #a2     \
               ", %" #a3 "}, %" #b ", p, 1, 1, 1;\n}\n"                                                         \
               : acc(d)                                                                                         \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))
template <int N, bool kBf16>
__device__ __forceinline__ void wgmma_rs_tb(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
  static_assert(N == 64 || N == 128, "wgmma_rs_tb: n = 64 or 128");
#define ISSUE64(ab) HFP_WGMMA_RS(ab, 64, HFP_REGS32, HFP_ACC32, 37, 32, 33, 34, 35, 36)
#define ISSUE128(ab) HFP_WGMMA_RS(ab, 128, HFP_REGS64, HFP_ACC64, 69, 64, 65, 66, 67, 68)
  if constexpr (N == 64) { HFP_BOTH_TYPES(ISSUE64); }
  else { HFP_BOTH_TYPES(ISSUE128); }
#undef ISSUE64
#undef ISSUE128
}

// ---------------------------------------------------------------- accumulator rows out through shared memory
// A warp's 16 accumulator rows (the layout above) leave in two steps, so that global memory takes 16-byte stores of
// whole rows instead of one 4-byte store per thread, row and 8-column block (eight rows, eight lines, a store):
// stage_warp_rows writes them as 16-bit pairs into a 16-row tile of kCols * 2 bytes a row whose 16-byte chunk c of
// row r sits at chunk position c ^ (r % 8) (stmatrix's eight rows, and a row's reads, fall on distinct banks), and
// copy_warp_rows, after a __syncwarp, stores the tile out chunk by chunk. Row g is scaled by scale_g, row g + 8 by
// scale_g8 (lane = 4 g + t).
// kBlockBytes: where 64-column block b of the tile starts (tile + b * kBlockBytes); by default the blocks sit side by
// side in rows of kCols * 2 bytes. With kBlockBytes >= 16 * 128 each block is a 16-row SW128 sub-tile of its own
// (rows of 128 bytes): the layout of a TMA box of 64 columns (tma.cuh), as a warp's rows of the Q tile are.
template <bool kBf16, int kCols, int kBlockBytes = 128>
__device__ __forceinline__ void stage_warp_rows(uint32_t tile, const float (&d)[kCols / 2], float scale_g,
                                                float scale_g8, int lane) {
  static_assert(kCols % 64 == 0, "whole 64-column blocks: the swizzle permutes eight chunks");
  using Pack = ElemTraits<kBf16>;
  constexpr int kRowBytes = kBlockBytes == 128 ? kCols * 2 : 128;
  const int matrix = lane >> 3;  // this lane's row address is for stmatrix's matrix `matrix`: rows 8 (matrix % 2)..
  const int row = (matrix & 1) * 8 + (lane & 7);  // .. of 8-column block 2 p + matrix / 2
  const uint32_t row_at = tile + row * kRowBytes;
  const int swizzle = (matrix >> 1) ^ (row & 7);
#pragma unroll
  for (int p = 0; p < kCols / 16; ++p) {  // blocks 2 p and 2 p + 1 (16-byte chunks of 64-column block p / 4)
    const float* b = d + 8 * p;
    const uint32_t r[4] = {Pack::pack2(b[0] * scale_g, b[1] * scale_g), Pack::pack2(b[2] * scale_g8, b[3] * scale_g8),
                           Pack::pack2(b[4] * scale_g, b[5] * scale_g), Pack::pack2(b[6] * scale_g8, b[7] * scale_g8)};
    // (the two forms are one address where the blocks sit side by side; the first is the backward's machine code)
    stmatrix_x4(row_at + (kBlockBytes == 128 ? ((2 * p) ^ swizzle) << 4
                                             : (p / 4) * kBlockBytes + ((((2 * p) & 7) ^ swizzle) << 4)),
                r);
  }
}

// Row_address(r) (r = 0..15): where the tile's row r goes in global memory (16-byte aligned), or nullptr for a row
// not written. A warp instruction stores 512 contiguous bytes of rows at kCols = 128 (256 at 64).
template <int kCols, typename RowAddress>
__device__ __forceinline__ void copy_warp_rows(uint32_t tile, int lane, RowAddress row_address) {
  constexpr int kChunks = kCols / 8;  // 16-byte chunks a row
#pragma unroll
  for (int k = 0; k < 16 * kChunks / 32; ++k) {
    const int i = lane + 32 * k, row = i / kChunks, chunk = i % kChunks;
    uint32_t v0, v1, v2, v3;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3)
                 : "r"(tile + row * (kCols * 2) + ((chunk ^ (row & 7)) << 4))
                 : "memory");
    void* const dst = row_address(row);
    if (dst != nullptr) *reinterpret_cast<uint4*>(static_cast<char*>(dst) + chunk * 16) = make_uint4(v0, v1, v2, v3);
  }
}

}  // namespace sm90
}  // namespace hfp
