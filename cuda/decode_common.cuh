// hf_flashpatch: what the decode kernels share: the compile-time configuration, tile constants,
// the parameter block and the per-sequence geometry (cuda/decode.cu, cuda/decode_combine.cuh).
//
// Layout: q (B, S_q, H, D) (or packed (T_q, H, D) with cu_seqlens_q), out likewise, lse (B, H, S_q)
// fp32 (any strides); split workspaces o_part (split, flat token, H, D), lse_part (split, flat token, H).
//
// Compile-time config (from DecodeConfig): HEAD_DIM, ELEM_BF16, KV_ADDRESSING, SOFTCAP, STAGES, and the
// bandwidth variants (all 0 by default, which compiles to the original kernel):
//   L2_PREFETCH, COALESCED_LOADS  the tile copy pattern (decode_kv_load.cuh);
//   STAGGER_TILES  each warp walks its tiles starting at a CTA-dependent rotation, so the CTAs that run
//                  together do not all read the same offset of equally strided (power-of-two apart)
//                  cache regions at the same time (DRAM channel / L2 slice camping);
//   EARLY_ISSUE    a warp refills the slot it has just finished before waiting for its next tile, so
//                  STAGES tiles (not STAGES - 1) are in flight while it waits.
//   INDEX_AHEAD    (with COALESCED_LOADS) each lane's page-table / slot-table entry for its key of the
//                  warp's next tile is loaded one tile early (software pipelined), so a tile's copies never
//                  wait on the dependent table read; the contiguous form has no table (no change).
//   L2_AHEAD       (with COALESCED_LOADS and INDEX_AHEAD) the entries run two tiles ahead and the rows of
//                  the warp's tile after the one being copied are prefetched into L2 (prefetch.global.L2):
//                  one more tile per warp in flight without more shared memory, and the address
//                  translation of a scattered page (TLB miss) happens a tile before the copy needs it.
//   PAGE_TILES     (block table, with COALESCED_LOADS) when pages hold whole 16-key tiles and the CTA's key
//                  chunk starts on a tile boundary, every tile lies inside one page: one table entry per
//                  tile (the same address for every lane) and the 16 row addresses are plain arithmetic
//                  from it, instead of one entry per key and two 64-bit pointer shuffles per copy
//                  instruction (32 SHFL per tile and warp, on the pipe the copies and ldmatrix use).
//   Q_IN_REGS      Q's mma A-fragments are loaded once into registers (D = 32, 96, 128: D / 4 registers)
//                  instead of re-read from shared memory for every tile (a third of the per-tile
//                  ldmatrix traffic, which shares the L1/shared-memory pipe with the K/V copies).
#pragma once
#include "primitives.cuh"
#include "decode_kv_address.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef ELEM_BF16
#define ELEM_BF16 1
#endif
#ifndef SOFTCAP
#define SOFTCAP 0
#endif
#ifndef STAGES
#define STAGES 3
#endif
#ifndef STAGGER_TILES
#define STAGGER_TILES 0
#endif
#ifndef EARLY_ISSUE
#define EARLY_ISSUE 0
#endif
#ifndef Q_IN_REGS
#define Q_IN_REGS 0
#endif
#ifndef INDEX_AHEAD
#define INDEX_AHEAD 0
#endif
#ifndef L2_AHEAD
#define L2_AHEAD 0
#endif
#ifndef PAGE_TILES
#define PAGE_TILES 0
#endif
#if INDEX_AHEAD && !COALESCED_LOADS
#error "INDEX_AHEAD is implemented for the COALESCED_LOADS copy pattern"
#endif
#if PAGE_TILES && !COALESCED_LOADS
#error "PAGE_TILES is implemented for the COALESCED_LOADS copy pattern"
#endif
#if L2_AHEAD && !INDEX_AHEAD
#error "L2_AHEAD needs INDEX_AHEAD (its prefetch addresses come from the entries loaded ahead)"
#endif

namespace hfp {

constexpr int kHeadDim = HEAD_DIM;
constexpr int kWarps = 4;
constexpr int kRows = 16;                       // one mma M tile of query rows per CTA
constexpr int kTileKeys = 16;                   // keys per warp tile
constexpr int kChunks = kHeadDim / 8;           // 16-byte chunks per row
// XOR swizzle of 16-byte chunks by (row % 8) removes ldmatrix bank conflicts; only valid when a row
// holds a multiple of 8 chunks (D = 64, 128, 256). D = 32 / 96 run unswizzled (correct, slower).
constexpr bool kSwizzle = (kChunks % 8) == 0;
constexpr int kTileElems = kTileKeys * kHeadDim;  // one K (or V) tile in shared memory
constexpr int kStageElems = 2 * kTileElems;       // K tile then V tile
// Q fragments in registers only where the extra registers cost no residency: D = 64 runs 4 CTAs/SM
// (shared-memory bound), which leaves exactly 128 registers per thread, and Q would push it to ~155
// (3 CTAs/SM); D = 256 is at the 255-register limit already.
constexpr bool kQInRegs = Q_IN_REGS != 0 && kHeadDim <= 128 && kHeadDim != 64;

using Traits = ElemTraits<ELEM_BF16 != 0>;
using Elem = Traits::T;

__device__ __forceinline__ int swz(int row, int chunk) {
  return kSwizzle ? (chunk ^ (row & 7)) : chunk;
}
// Element offset of (row, chunk) inside a [rows][HEAD_DIM] shared-memory tile.
__device__ __forceinline__ int tile_offset(int row, int chunk) { return row * kHeadDim + swz(row, chunk) * 8; }

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
  float* o_part;    // (num_splits, B, S_q, H, D) fp32, used when num_splits > 1
  float* lse_part;  // (num_splits, B, S_q, H) fp32
  int batch, heads, kv_heads, num_splits, row_tiles;
  int total_q;  // flat query tokens: B * S_q (batched) or T_q (packed)
  float score_mul;    // no softcap: scale * log2(e); softcap: scale / softcap
  float softcap_mul;  // softcap * log2(e)
  int window_left, window_right;  // -1: unbounded
};

__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

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
