// hf_flashpatch: what the decode kernels share: the compile-time configuration, tile constants,
// the parameter block and the per-sequence geometry (cuda/decode.cu, cuda/decode_combine.cuh).
//
// Layout: q (B, S_q, H, D) (or packed (T_q, H, D) with cu_seqlens_q), K rows of D, V rows of D_v, out
// (B, S_q, H, D_v) likewise, lse (B, H, S_q) fp32 (any strides); split workspaces o_part (split, flat token,
// H, D_v), lse_part (split, flat token, H).
//
// Compile-time config (from DecodeConfig): HEAD_DIM (q/k), HEAD_DIM_V (v/out; HEAD_DIM when not given:
// multi-head latent attention's 192/128 gives it), ELEM_BF16, KV_ADDRESSING, SOFTCAP, STAGES.
// The K/V tile copy (decode.cu issue_tile): each copy instruction covers whole rows (32 lanes x 16 B =
// 512 consecutive bytes at D = 128), row addresses come from the lane that located the key (a warp
// shuffle), and each lane's page-table / slot-table entry for the warp's next tile is loaded one tile
// early, so a tile's copies never wait on the dependent table read. PAGE_TILES (block table, derived
// below): when pages hold whole 16-key tiles and the CTA's key chunk starts on a tile boundary, every
// tile lies inside one page: one table entry per tile and the 16 row addresses are plain arithmetic
// from it, instead of one entry per key and two 64-bit pointer shuffles per copy instruction.
#pragma once
#include "primitives.cuh"
#include "decode_kv_address.cuh"
#include "score_scale.cuh"
#include "visibility.cuh"

#if !defined(HEAD_DIM) || !defined(ELEM_BF16) || !defined(SOFTCAP) || !defined(STAGES)
#error "HEAD_DIM, ELEM_BF16, SOFTCAP and STAGES come from the build (hf_flashpatch/kernels/decode_config.py)"
#endif
#ifndef HEAD_DIM_V
#define HEAD_DIM_V HEAD_DIM
#endif
// D = 32 keeps the per-key form: with both copy forms ptxas spills 4 bytes in its prologue.
#define PAGE_TILES (KV_ADDRESSING == 1 && HEAD_DIM != 32)

namespace hfp {

constexpr int kHeadDim = HEAD_DIM;    // q / k rows
constexpr int kHeadDimV = HEAD_DIM_V;  // v / out rows
constexpr int kWarps = 4;
constexpr int kRows = 16;                       // one mma M tile of query rows per CTA
constexpr int kTileKeys = 16;                   // keys per warp tile
constexpr int kChunks = kHeadDim / 8;           // 16-byte chunks per q / k row
constexpr int kChunksV = kHeadDimV / 8;         // ... per v row
constexpr int kKTileElems = kTileKeys * kHeadDim;   // one K tile in shared memory
constexpr int kVTileElems = kTileKeys * kHeadDimV;  // one V tile
constexpr int kStageElems = kKTileElems + kVTileElems;  // K tile then V tile

using Traits = ElemTraits<ELEM_BF16 != 0>;
using Elem = Traits::T;

// Element offset of (row, chunk) inside a [rows][kDim] shared-memory tile. XOR swizzle of 16-byte chunks by
// (row % 8) removes ldmatrix bank conflicts; only valid when a row holds a multiple of 8 chunks (D = 64, 128,
// 192, 256). D = 32 / 96 run unswizzled (correct, slower).
template <int kDim>
__device__ __forceinline__ int tile_offset(int row, int chunk) {
  constexpr bool kSwizzle = (kDim / 8) % 8 == 0;
  return row * kDim + (kSwizzle ? (chunk ^ (row & 7)) : chunk) * 8;
}

struct DecodeParams {
  const Elem* q;
  long long q_stride_b, q_stride_s, q_stride_h;
  const int* cu_seqlens_q;  // packed q (nullptr: q is (B, S_q, H, D))
  int seqlen_q;             // S_q (packed: max tokens per sequence)
  KvAddressT<Elem> kv;
  Elem* out;
  long long out_stride_b, out_stride_s, out_stride_h;
  float* lse;
  long long lse_stride_b, lse_stride_h, lse_stride_s;
  float* o_part;    // (num_splits, B, S_q, H, D_v) fp32, used when num_splits > 1
  float* lse_part;  // (num_splits, B, S_q, H) fp32
  int batch, heads, kv_heads, num_splits, row_tiles;
  int total_q;  // flat query tokens: B * S_q (batched) or T_q (packed)
  ScoreScale scores;  // softmax scale and soft-cap (score_scale.cuh)
  int window_left, window_right;  // -1: unbounded
};

// Per-sequence geometry shared by the split kernel and the combine kernel. Packed q: the rows of
// cu_seqlens_q clamped into [0, total_q) (primitives.cuh packed_span), at most seqlen_q of them.
__device__ __forceinline__ void sequence_queries(const DecodeParams& p, int b, int& q_begin, int& n_q) {
  if (p.cu_seqlens_q != nullptr) {
    const int2 span = packed_span(p.cu_seqlens_q, b, p.total_q);
    q_begin = span.x;
    n_q = min(span.y, p.seqlen_q);
  } else {
    q_begin = 0;
    n_q = p.seqlen_q;
  }
}

// Flat token index of (sequence b, token tok): the row of out / lse / workspace.
__device__ __forceinline__ long long flat_token(const DecodeParams& p, int b, int q_begin, int tok) {
  return p.cu_seqlens_q ? (long long)(q_begin + tok) : (long long)b * p.seqlen_q + tok;
}

}  // namespace hfp
