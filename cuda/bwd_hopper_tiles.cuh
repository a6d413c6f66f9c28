// hf_flashpatch: what the Hopper backward body (bwd_hopper.cuh) is built from. Its compile-time configuration: the
// tiles, which products a step keeps in flight, the Q / dO stages and dS^T buffers, dQ's path, and the shared-memory
// footprint they add up to (each choice with its reason; the measurements behind them in notes/backward.md). Then
// its building blocks: the block's K / V copy, the products' issue on wgmma, and the packing of accumulators into
// A fragments. Layouts as in bwd.cu; built with BWD_WGMMA=1 for sm_90a (d64, d128, and q/k 192 with v 128).
#pragma once
#include "hopper.cuh"

namespace hfp {
namespace bwd {

constexpr int kHBlockN = 128;  // keys per block: two warpgroups x 64
constexpr int kHBlockM = BWD_WGMMA_BLOCK_M;
// d64 takes 128-query steps: S^T / dP^T are 64 x 128 per warpgroup (wgmma n128), half the steps and so half
// the per-step waits, barriers and stage hand-overs per FLOP; dQ (128 queries x 64) splits by query rows, each
// warpgroup its 64 over all 128 keys. d128 keeps 64-query steps (registers) and splits dQ's columns.
constexpr bool kHDqRows = kHBlockM == 128;
static_assert(kHBlockM == (kD == 64 ? 128 : 64), "d64 runs 128-query steps, d128 and d192 64-query steps");
constexpr bool kHValueOwn = kDv != kD;  // 192/128 (multi-head latent attention)
static_assert(kHValueOwn ? (kD == 192 && kDv == 128) : (kD == 64 || kD == 128),
              "the wgmma backward body serves head dims 64 and 128, and q/k 192 with v 128");
// Queries per sub-step (S^T, dP^T, P^T, dS^T, dV, dK): the whole step but at 192/128 (registers, see above).
constexpr int kHSubM = kHValueOwn ? 32 : kHBlockM;
constexpr int kHSubSteps = kHBlockM / kHSubM;
constexpr int kHRowBytes = sm90::kSwizzleRowBytes;
constexpr int kHKBytes = kHBlockN * kD * 2;    // K tile
constexpr int kHVBytes = kHBlockN * kDv * 2;   // V tile
constexpr int kHQBytes = kHBlockM * kD * 2;    // one stage of Q
constexpr int kHDoBytes = kHBlockM * kDv * 2;  // one stage of dO
constexpr int kHKSubBytes = kHBlockN * kHRowBytes;    // a K / V tile's 64-column sub-tile
constexpr int kHStepSubBytes = kHBlockM * kHRowBytes;  // a Q / dO stage's 64-column sub-tile
constexpr int kHDsBytes = kHBlockN * kHBlockM * 2;  // dS^T: 128 keys x kHBlockM queries, 64-query sub-tiles
constexpr int kHDsSubBytes = kHBlockN * kHRowBytes;   // one sub-tile: 128 keys x 64 queries (one 128-byte row each)
// dQ's 64-column rounds of the warpgroup with the most (192/128: 2 of the 3 blocks; see the step's dQ)
constexpr int kHDqRounds = kHValueOwn ? 2 : 1;
constexpr bool kHDqSplit = kD == 128;  // d128: dQ's columns split; d64 (kHDqRows): its query rows
// d128: dK/dV (128 registers) + P^T/dS^T fragments (32) + dQ (32) spill (8 B with --use_fast_math), so dV and
// dK retire before dQ is issued (192/128: every sub-step retires its own); d64 keeps all three products in
// flight together.
constexpr bool kHRetireBeforeDq = kD == 128;
// Without softcap, P^T is formed while dP^T runs and dS^T while dV runs; softcap needs 1 - tanh^2 of each
// score for dS^T, so P^T and dS^T are formed in one pass after both products.
constexpr bool kHPipelined = !HAS_SOFTCAP;
// Q/dO (+ lse2, D) stages, each copied by the TMA (thread 0 announces the stage's bytes on its mbarrier and
// issues a box per 64 columns of Q and of dO and one box of the two statistics rows), and two dS^T buffers: no
// block barrier at a step's start, so a warpgroup that finishes its dQ share first starts the next step's S^T /
// dP^T, and the two warpgroups meet only at (B). Stage s - 1 is refilled after (B) of step s with step
// s - 1 + kHQStages: both warpgroups are past it then (at d64 too, whose dV / dK of step s - 1 retire at its dQ
// wait). dS^T of step s + 1 goes to the other buffer while dQ of step s may still read its own. d64 takes two
// stages, loaded one step ahead, so that its second dS^T buffer fits beside dQ's staging.
constexpr int kHQStages = kD == 64 ? 2 : 3;
constexpr int kHLoadAhead = kHQStages - 1;  // a stage is loaded this many steps ahead
// d128: the next step's S^T is issued as soon as this step's dQ product is, so the tensor cores compute it while dQ
// goes through shared memory to the TMA, and the next step's P^T starts on scores already retired (its registers
// are free then: dK, dV, dQ and S^T make 192 of them). d64 and 192/128 have no registers to spare for it.
constexpr bool kHScoresAhead = kHPipelined && !kHValueOwn && kHDqSplit;
constexpr int kHDsBuffers = kHValueOwn ? 1 : 2;  // 192/128: two would take 239 KB
// d64 / d128: dQ leaves through shared memory, each warpgroup's 64 x 64 (d128: its columns, d64: its query rows)
// as two 64-row x 32-column fp32 boxes (SW128), added to the workspace by the TMA (one thread,
// tma::reduce_add_box), so the math warps issue no reductions. 192/128 has no room and keeps the reductions from
// registers.
constexpr bool kHDqTma = !kHValueOwn;
constexpr int kHDqBoxBytes = 64 * 32 * 4;
constexpr int kHDqStageBytes = kHDqTma ? 2 * 2 * kHDqBoxBytes : 0;  // two warpgroups x two boxes
// A stage's lse2 and D rows (fp32) come in one box of the stats map. A TMA copy starts 16-byte aligned in its
// innermost dim (the rows here), so the box starts at the step's first row rounded down to a multiple of 4 and
// takes 4 more rows (kernels/tma.py, stats_descriptor); a step reads its rows from offset (first row % 4).
constexpr int kHStatsRows = kHBlockM + 4;
constexpr int kHStatsBoxBytes = 2 * kHStatsRows * 4;
constexpr int kHStatsBytes = (kHStatsBoxBytes + 127) / 128 * 128;  // a stage's box, 128-byte aligned for the copy
constexpr int kHStageBytes = kHQBytes + kHDoBytes + kHStatsBoxBytes;  // the bytes a stage's mbarrier waits for
static_assert(kThreads == 256, "the wgmma backward body runs two warpgroups");

// The shared-memory footprint (bytes, before the 1 KB alignment slack): K, V, kHQStages stages of Q and dO,
// kHDsBuffers of dS^T, dQ's staging, kHQStages stages of lse2 / D, then the stage mbarriers.
// The launch provides it plus 1 KB to round the base up (bwd.cu: bwd_dkdv_dq_atomic_shared_bytes).
constexpr int kHSmemBytes = kHKBytes + kHVBytes + kHQStages * (kHQBytes + kHDoBytes) + kHDsBuffers * kHDsBytes +
                            kHDqStageBytes + kHQStages * kHStatsBytes + 8 * kHQStages;

// Columns [kFirst, kFirst + kLen) of an accumulator row block as an accumulator of its own (8-column blocks are
// 4 consecutive registers: the m64nNk16 layout of columns 8j.. is d[4j..4j+3] whatever N is).
template <int kFirst, int kLen, int N>
__device__ __forceinline__ float (&acc_columns(float (&d)[N]))[kLen / 2] {
  static_assert(kFirst % 8 == 0 && kFirst / 2 + kLen / 2 <= N, "whole 8-column blocks inside the accumulator");
  return *reinterpret_cast<float(*)[kLen / 2]>(d + kFirst / 2);
}

// Copy rows [0, kRows) of a (rows, kCols) matrix into a SW128 tile (the block's K and V); rows >= valid_rows zero-filled (their copy
// reads the tile's first row, in bounds, for none of its bytes). The threads cover whole rows at a time where a
// row's 16-byte chunks divide them, else (192 columns: 24 chunks) one 64-column sub-tile after the other. A
// thread's rows lie kRowStep apart: one 64-bit add per row, not a row * stride product.
template <int kRows, int kCols>
__device__ __forceinline__ void h_load_tile(uint32_t tile, const T* gmem, int64_t row_stride, int valid_rows, int tid) {
  constexpr int kPartChunks = kThreads % (kCols / 8) == 0 ? kCols / 8 : 8;  // the chunks of a row one pass covers
  constexpr int kRowStep = kThreads / kPartChunks;
  static_assert(kRows % kRowStep == 0 && kRowStep % 8 == 0, "rows walked 8-aligned keep one swizzle position");
  const int row0 = tid / kPartChunks;
  const int64_t step = kRowStep * row_stride;
#pragma unroll
  for (int part = 0; part < kCols / 8 / kPartChunks; ++part) {
    const int chunk = part * kPartChunks + tid % kPartChunks;
    uint32_t dst = tile + (chunk / 8) * (kRows * kHRowBytes) + sm90::sw128_offset(row0, chunk % 8);
    const T* src = gmem + row0 * row_stride + chunk * 8;
#pragma unroll
    for (int i = 0; i < kRows / kRowStep; ++i) {
      const bool ok = row0 + i * kRowStep < valid_rows;
      cp_async_16(dst, ok ? src : gmem, ok);
      dst += kRowStep * kHRowBytes;
      src += step;
    }
  }
}

// (64 rows x kWidth) x (kWidth x N) products over a head dim of kWidth (q/k's or v's): a_rows / b_rows = the
// descriptors of the operands' first rows (K-major both), kATileRows / kBTileRows = the rows of their whole tiles
// (the 64-column sub-tile stride).
template <int N, int kWidth, int kATileRows, int kBTileRows>
__device__ __forceinline__ void h_issue_nt(float (&d)[N / 2], sm90::SteppedDescriptor a_rows,
                                           sm90::SteppedDescriptor b_rows) {
#pragma unroll
  for (int ks = 0; ks < kWidth / 16; ++ks) {
    const uint32_t k_offset = (ks % 4) * 32;
    sm90::wgmma_ss<N, kBf16>(d, a_rows.plus((ks / 4) * (kATileRows * kHRowBytes) + k_offset).value(),
                             b_rows.plus((ks / 4) * (kBTileRows * kHRowBytes) + k_offset).value(), ks > 0);
  }
}

// acc (64 keys x kCols) += A (64 keys x kHSubM queries, registers) * B (kHSubM queries x kCols: a Q or dO stage
// offset to the sub-step's first query, read MN-major: b_rows' leading offset is a 64-column sub-tile). 192
// columns: one n128 and one n64 wgmma per k-step.
template <int kCols>
__device__ __forceinline__ void h_issue_rs(float (&d)[kCols / 2], const uint32_t (&a)[kHSubM / 16][4],
                                           sm90::SteppedDescriptor b_rows) {
#pragma unroll
  for (int kk = 0; kk < kHSubM / 16; ++kk) {
    const sm90::SteppedDescriptor rows = b_rows.plus(kk * 16 * kHRowBytes);
    if constexpr (kCols == 192) {
      sm90::wgmma_rs_tb<128, kBf16>(acc_columns<0, 128>(d), a[kk], rows.value(), 1);
      sm90::wgmma_rs_tb<64, kBf16>(acc_columns<128, 64>(d), a[kk], rows.plus(2 * kHStepSubBytes).value(), 1);
    } else {
      sm90::wgmma_rs_tb<kCols, kBf16>(d, a[kk], rows.value(), 1);
    }
  }
}

// dq (64 queries x 64 columns) = dS (64 queries x 128 keys: the dS^T tile at ds_rows read MN-major) * K (128 keys x
// 64 columns: the K tile's sub-tile at k_cols, read MN-major).
__device__ __forceinline__ void h_issue_dq(float (&dq)[32], sm90::SteppedDescriptor ds_rows,
                                           sm90::SteppedDescriptor k_cols) {
#pragma unroll
  for (int kk = 0; kk < kHBlockN / 16; ++kk)  // all 128 keys, 16 per k-step
    sm90::wgmma_ss<64, kBf16, 1, 1>(dq, ds_rows.plus(kk * 16 * kHRowBytes).value(),
                                    k_cols.plus(kk * 16 * kHRowBytes).value(), kk > 0);
}

// Accumulator (64 keys x kHSubM queries per warpgroup, fp32) -> A fragments of the next product (b16 pairs), one
// k-step (16 queries) or all.
__device__ __forceinline__ void h_pack_step(uint32_t (&a)[4], const float (&acc)[kHSubM / 2], int kk) {
  a[0] = Traits::pack2(acc[8 * kk + 0], acc[8 * kk + 1]);
  a[1] = Traits::pack2(acc[8 * kk + 2], acc[8 * kk + 3]);
  a[2] = Traits::pack2(acc[8 * kk + 4], acc[8 * kk + 5]);
  a[3] = Traits::pack2(acc[8 * kk + 6], acc[8 * kk + 7]);
}
__device__ __forceinline__ void h_pack(uint32_t (&a)[kHSubM / 16][4], const float (&acc)[kHSubM / 2]) {
#pragma unroll
  for (int kk = 0; kk < kHSubM / 16; ++kk) h_pack_step(a[kk], acc, kk);
}

}  // namespace bwd
}  // namespace hfp
