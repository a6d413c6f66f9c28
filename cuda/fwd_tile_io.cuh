// hf_flashpatch forward: moving tiles between global memory, padded shared memory and mma fragments.
//
// Shared-memory tiles are row-major (row = query row or key, column = head-dim element) with a row
// stride of head dim + 8 elements. The 16-byte pad shifts consecutive rows by 4 banks, so the eight
// 16-byte row segments an ldmatrix phase reads (and the 16-byte cp.async writes) fall in eight
// distinct bank groups for every supported head dim (32, 64, 96, 128, 256).
#pragma once
#include "primitives.cuh"

namespace hfp {
namespace fwd {

template <int kHeadDim>
struct TileLayout {
  static constexpr int kRowStride = kHeadDim + 8;     // elements
  static constexpr int kChunksPerRow = kHeadDim / 8;  // 16-byte chunks per row
};

// How kThreadCount threads share the 16-byte chunks of a (kRows, head dim) tile: kPerThread each.
// Where the threads divide a row's chunks evenly (kFixedColumn), thread tid keeps column col(tid) and
// walks rows row0(tid), row0(tid) + kRowStep, ...; otherwise chunk tid + i * kThreadCount is its i-th.
template <int kHeadDim, int kRows, int kThreadCount>
struct ChunkWalk {
  using L = TileLayout<kHeadDim>;
  static constexpr int kPerThread = kRows * L::kChunksPerRow / kThreadCount;
  static_assert(kRows * L::kChunksPerRow % kThreadCount == 0, "tile chunks must divide evenly over the threads");
  static constexpr bool kFixedColumn = kThreadCount % L::kChunksPerRow == 0;
  static constexpr int kRowStep = kThreadCount / L::kChunksPerRow;
  __device__ static __forceinline__ int row0(int tid) { return tid / L::kChunksPerRow; }
  __device__ static __forceinline__ int col(int tid) { return (tid % L::kChunksPerRow) * 8; }
};

// Copy a (rows, head dim) key/value tile starting at key `key0` into shared memory with cp.async.
// Keys at or beyond `seqlen_k` are zero-filled: their probabilities are 0 after masking, and zeros
// (not stale data that might hold NaN/inf) keep 0 * V finite.
template <int kHeadDim, int kRows, int kThreadCount, typename T>
__device__ __forceinline__ void load_kv_tile(T* smem, const T* gmem, int64_t row_stride, int key0, int seqlen_k,
                                             int tid) {
  using L = TileLayout<kHeadDim>;
  using W = ChunkWalk<kHeadDim, kRows, kThreadCount>;
  if constexpr (W::kFixedColumn) {  // one pointer and one increment per thread
    const int row0 = W::row0(tid), col = W::col(tid);
    const T* src = gmem + (key0 + row0) * row_stride + col;
    const int64_t step = W::kRowStep * row_stride;
    uint32_t dst = smem_addr(smem + row0 * L::kRowStride + col);
#pragma unroll
    for (int i = 0; i < W::kPerThread; ++i) {
      const bool valid = key0 + row0 + i * W::kRowStep < seqlen_k;
      cp_async_16(dst, valid ? src : gmem, valid);
      src += step;
      dst += W::kRowStep * L::kRowStride * sizeof(T);
    }
  } else {
#pragma unroll
    for (int i = 0; i < W::kPerThread; ++i) {
      const int chunk = tid + i * kThreadCount;
      const int row = chunk / L::kChunksPerRow;
      const int col = (chunk % L::kChunksPerRow) * 8;
      const int key = key0 + row;
      const bool valid = key < seqlen_k;
      const T* src = gmem + (valid ? key * row_stride + col : 0);
      cp_async_16(smem_addr(smem + row * L::kRowStride + col), src, valid);
    }
  }
}

// Visit this thread's 16-byte chunks of a packed (kRows, head dim) tile: fn(row, col, pos, head,
// valid), where tile row `row` is packed row p = p0 + row, i.e. query position pos = p / group of
// head `head` = p % group within the GQA group, and valid = p < packed_rows. A thread keeps one
// column and walks rows kThreadCount / chunks-per-row apart, so (pos, head) advance by a constant
// step: one integer division per thread instead of one per chunk (none for MHA).
template <int kHeadDim, int kRows, int kThreadCount, typename Fn>
__device__ __forceinline__ void for_each_packed_chunk(int tid, int p0, int packed_rows, int group, Fn&& fn) {
  using L = TileLayout<kHeadDim>;
  using W = ChunkWalk<kHeadDim, kRows, kThreadCount>;
  if constexpr (W::kFixedColumn) {
    const int row0 = W::row0(tid), col = W::col(tid);
    const int first = p0 + row0;
    int pos = group == 1 ? first : first / group;
    int head = first - pos * group;
    const int step_pos = group == 1 ? W::kRowStep : W::kRowStep / group;
    const int step_head = W::kRowStep - step_pos * group;
#pragma unroll
    for (int i = 0; i < W::kPerThread; ++i) {
      const int row = row0 + i * W::kRowStep;
      fn(row, col, pos, head, p0 + row < packed_rows);
      pos += step_pos;
      head += step_head;
      if (head >= group) {
        head -= group;
        ++pos;
      }
    }
  } else {  // chunks per row do not divide the thread count (head dim 96): divide per chunk
#pragma unroll
    for (int i = 0; i < W::kPerThread; ++i) {
      const int chunk = tid + i * kThreadCount;
      const int row = chunk / L::kChunksPerRow;
      const int packed = p0 + row;
      const int pos = group == 1 ? packed : packed / group;
      fn(row, (chunk % L::kChunksPerRow) * 8, pos, packed - pos * group, packed < packed_rows);
    }
  }
}

// Copy a packed (kRows, head dim) tile (rows as in for_each_packed_chunk) between its global rows
// (`base` + pos * pos_stride + head * head_stride) and a padded shared-memory tile, 16 bytes per access.
// kToShared: the query tile, with cp.async; rows at or beyond `packed_rows` are zero-filled. Packing the
// heads of a GQA group into the rows lets one K/V tile serve the whole group. Otherwise: the output tile
// staged in shared memory, stored; rows at or beyond `packed_rows` are skipped.
template <bool kToShared, int kHeadDim, int kRows, int kThreadCount, typename G, typename T>
__device__ __forceinline__ void copy_packed_tile(G* base, T* smem, int64_t pos_stride, int64_t head_stride, int p0,
                                                 int packed_rows, int group, int tid) {
  using L = TileLayout<kHeadDim>;
  for_each_packed_chunk<kHeadDim, kRows, kThreadCount>(
      tid, p0, packed_rows, group, [&](int row, int col, int pos, int head, bool valid) {
        G* global = base + (valid ? pos * pos_stride + head * head_stride + col : 0);
        if constexpr (kToShared) {
          cp_async_16(smem_addr(smem + row * L::kRowStride + col), global, valid);
        } else if (valid) {
          *reinterpret_cast<uint4*>(global) = *reinterpret_cast<const uint4*>(smem + row * L::kRowStride + col);
        }
      });
}

// A operand (16 rows x 16 columns starting at (row0, col0)) of m16n8k16 from a row-major tile.
// Matrix j of the x4 load is (rows +8*(j%2), cols +8*(j/2)), matching a[0..3] of the A fragment.
template <int kHeadDim, typename T>
__device__ __forceinline__ void load_a_frag(uint32_t (&a)[4], const T* smem, int row0, int col0, int lane) {
  using L = TileLayout<kHeadDim>;
  ldmatrix_x4(a, smem_addr(smem + (row0 + (lane & 15)) * L::kRowStride + col0 + (lane >> 4) * 8));
}

// B operands of S = Q K^T for two 8-key n-tiles (keys key0..key0+15) and head-dim columns
// col0..col0+15: b[0..1] for keys key0..+7, b[2..3] for keys key0+8..+15.
template <int kHeadDim, typename T>
__device__ __forceinline__ void load_k_frag(uint32_t (&b)[4], const T* smem, int key0, int col0, int lane) {
  using L = TileLayout<kHeadDim>;
  const int key = key0 + (lane & 7) + ((lane >> 4) << 3);
  const int col = col0 + ((lane >> 3) & 1) * 8;
  ldmatrix_x4(b, smem_addr(smem + key * L::kRowStride + col));
}

// B operands of O += P V for keys key0..key0+15 and two 8-wide head-dim n-tiles (col0..col0+15),
// transposed on the fly: b[0..1] for columns col0..+7, b[2..3] for col0+8..+15.
template <int kHeadDim, typename T>
__device__ __forceinline__ void load_v_frag(uint32_t (&b)[4], const T* smem, int key0, int col0, int lane) {
  using L = TileLayout<kHeadDim>;
  ldmatrix_x4_trans(b, smem_addr(smem + (key0 + (lane & 15)) * L::kRowStride + col0 + (lane >> 4) * 8));
}

}  // namespace fwd
}  // namespace hfp
