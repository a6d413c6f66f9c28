// hf_flashpatch: the Hopper body of bwd_dkdv_dq_atomic (built with BWD_WGMMA=1, sm_90a; d64, d128, and q/k 192
// with v 128): all five GEMMs of a step on warpgroup MMA (wgmma).
//
// Layout as in bwd.cu: q/dq (batch, seqlen_q, heads, D), k/dk (batch, seqlen_k, kv_heads, D), v/dv (batch, seqlen_k,
// kv_heads, D_v), out/dO (batch, seqlen_q, heads, D_v), D_v = D but at 192/128; varlen packs sequences along the
// token dim. One block of two warpgroups per (128-key tile,
// KV head, batch) loops over the group's query heads and the visible 64-query tiles, as the other bodies.
// Warpgroup w owns keys [64 w, 64 w + 64) of the tile, and their dK/dV in registers for the whole block.
//
// Per 64-query step, warpgroup w (shared-memory tiles in hopper.cuh's SW128 format):
//   S^T  = K_w Q^T    wgmma 64 x 64, K and Q both K-major (head dim along their rows)
//   dP^T = V_w dO^T   same
//   P^T  = exp2(logit(S^T) - lse2), dS^T = P^T (dP^T - D) (softcap: times 1 - tanh^2), in registers;
//                     pipelined (no softcap): P^T is formed while dP^T is still running, and dV += P^T dO
//                     is issued before dS^T is formed
//   dV  += P^T dO     wgmma 64 x D, P^T from registers (the accumulator layout is the A layout),
//   dK  += dS^T Q     dO and Q read MN-major (the head dim, the output index, along their rows)
//   dS^T -> shared memory by stmatrix (both warpgroups' 64-key halves form the 128 x 64 tile)
//   dQ   = dS K       wgmma with A = dS^T's tile read MN-major (transposed by the tensor core) and B = K
//                     MN-major: d128 splits dQ's columns, 64 per warpgroup; d64 (64 columns, one
//                     wgmma n64) splits its 128 query rows; 192/128 splits the columns 128 / 64, the
//                     warpgroups swapping shares from step to step.
//                     d64 / d128: dQ goes through shared memory to the TMA, which adds it to the fp32
//                     workspace (kHDqTma); 192/128 adds it with reductions from registers, as the other bodies.
//   d128 (no softcap): the next step's S^T is issued right after dQ and runs under dQ's stores (kHScoresAhead),
//                     so a step starts with dP^T on scores already retired.
// At 192/128 dK (96 registers) and dV (64) leave room for S^T / dP^T of 32 queries only: each 64-query step
// runs S^T .. dK in two sub-steps of 32 queries (kHSubM), each retiring its dV / dK before the next.
// Q/dO stages (with the steps' lse2 and D rows) are copied by the TMA, one thread issuing them kHLoadAhead steps
// ahead, and handed over by per-stage mbarriers (three stages at d128 and 192/128, two at d64); at d64 and d128 dS^T
// is double-buffered, so the one point per step where the warpgroups wait for each other is the barrier (B): both
// halves of dS^T are in shared memory (see kHQStages in bwd_hopper_tiles.cuh). 192/128 has one dS^T buffer: a second barrier before a
// step's first dS^T store waits for the previous step's dQ of both warpgroups.
#pragma once
#include "bwd_hopper_tiles.cuh"  // configuration, shared-memory footprint, K / V copy, products, packing
#include "hopper.cuh"
#include "tma.cuh"

namespace hfp {
namespace bwd {

// The maps (kernels/backward.py, _tensor_maps): q_map / do_map over q / dout (a box per 64 columns of a step's
// kHBlockM rows), stats_map over the (2, batch_ws, heads, rows_pad) lse2 / D workspace (a box: a step's rows of
// both), dq_map over the dQ workspace (kHDqTma builds).
__device__ __forceinline__ void dkdv_wgmma_body(const TmaDescriptor& dq_map, const TmaDescriptor& q_map,
                                                const TmaDescriptor& do_map, const TmaDescriptor& stats_map,
                                                HFP_DKDV_PARAMS) {
  using namespace sm90;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = (raw + kSwizzleAtomBytes - 1) & ~static_cast<uint32_t>(kSwizzleAtomBytes - 1);
  const uint32_t k_t = base;                       // SW128 (128 keys, D)
  const uint32_t v_t = k_t + kHKBytes;             // SW128 (128 keys, D_v)
  const uint32_t q_t = v_t + kHVBytes;                 // (kHQStages, SW128 (64 queries, D))
  const uint32_t do_t = q_t + kHQStages * kHQBytes;    // (kHQStages, SW128 (64 queries, D_v))
  const uint32_t ds_t = do_t + kHQStages * kHDoBytes;  // (kHDsBuffers, SW128 (128 keys, 64 queries)): dS^T
  const uint32_t dq_t = ds_t + kHDsBuffers * kHDsBytes;  // kHDqTma: (2 warpgroups, 2 boxes, SW128 (64, 32 fp32))
  const uint32_t stats_t = dq_t + kHDqStageBytes;  // (kHQStages, kHStatsBytes): (2, kHStatsRows) fp32, lse2 then D
  const float* stats_s = reinterpret_cast<const float*>(smem_raw + (stats_t - raw));
  const uint32_t full_bars = stats_t + kHQStages * kHStatsBytes;  // (kHQStages,) stage mbarriers, 8-aligned

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = uniform_warpgroup(tid);  // warp >> 2, which the compiler knows is warp-uniform: what depends on it
                                          // (operand descriptors, row offsets) stays in uniform registers
  const int g = lane >> 2, t4 = lane & 3;
  const DkdvBlock blk = dkdv_block(heavy_first);
  const int n_block = blk.n_block, hk = blk.kv_head, b = blk.batch;
  const int2 sq = sequence(cu_q, b, seqlen_q, total_q), sk = sequence(cu_k, b, seqlen_k, total_k);
  const int n0 = n_block * kHBlockN;
  if (n0 >= sk.y) return;
  const Visibility vis = visibility(sq.y, sk.y, left, right);
  const ScoreScale sc{scale_log2, softcap_pre, softcap_log2};
  const int group = heads / kv_heads;
  const int bw = cu_q == nullptr ? b : 0;  // workspace batch index (varlen packs into one)

  h_load_tile<kHBlockN, kD>(k_t, k + b * k_sb + int64_t(sk.x + n0) * k_ss + hk * k_sh, k_ss, sk.y - n0, tid);
  h_load_tile<kHBlockN, kDv>(v_t, v + b * v_sb + int64_t(sk.x + n0) * v_ss + hk * v_sh, v_ss, sk.y - n0, tid);
  cp_async_commit();

  const QuerySteps qs_range = query_steps<kHBlockM>(vis, n0, min(n0 + kHBlockN, sk.y), group);
  const int m_first = qs_range.m_first, m_count = qs_range.m_count, steps = qs_range.steps;

  // The steps walk the group's heads, each over its m_count query tiles: step i is head hk * group + i / m_count,
  // tile m_first + i % m_count. The loads, kHLoadAhead steps ahead, follow it with a cursor advanced by increments
  // (thread 0's); the computed step divides (a cursor for it too, live across the whole step, made the d64 and
  // 192/128 builds spill).
  struct StepCursor {
    int h, m0;
  };
  auto advance = [&](StepCursor& c) {
    c.m0 += kHBlockM;
    if (c.m0 == (m_first + m_count) * kHBlockM) {
      c.m0 = m_first * kHBlockM;
      ++c.h;
    }
  };
  // Thread 0: step c's stage by the TMA. The maps' rows are the sequence's (batched: zeros past its end) or the
  // packed tokens (varlen, batch 0: rows past the sequence belong to the next one; the step zeroes them).
  auto load_stage = [&](StepCursor c, int stage) {
    const uint32_t bar = full_bars + 8 * stage;
    const int row = sq.x + c.m0;
    tma::arrive_expect_bytes(bar, kHStageBytes);
#pragma unroll
    for (int sub = 0; sub < kD / 64; ++sub)
      tma::load_box(q_t + stage * kHQBytes + sub * kHStepSubBytes, q_map, sub * 64, c.h, row, bw, bar);
#pragma unroll
    for (int sub = 0; sub < kDv / 64; ++sub)
      tma::load_box(do_t + stage * kHDoBytes + sub * kHStepSubBytes, do_map, sub * 64, c.h, row, bw, bar);
    tma::load_box(stats_t + stage * kHStatsBytes, stats_map, row & ~3, c.h, bw, 0, bar);
  };

  float dv_acc[kDv / 2], dk_acc[kD / 2];  // (64 keys x D_v), (64 keys x D) per warpgroup, accumulator layout
#pragma unroll
  for (int i = 0; i < kDv / 2; ++i) dv_acc[i] = 0.f;
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) dk_acc[i] = 0.f;
  const int key_w = wg * 64 + (warp & 3) * 16 + g;  // this thread's first key row within the tile (+8: second)
  // dS^T's stores by stmatrix_x4, one per 16 queries: matrices (chunk 2 p, keys 0-7 of the warp's 16), (2 p, 8-15),
  // (2 p + 1, 0-7), (2 p + 1, 8-15) of a 64-query sub-tile, the packed fragments ds_frag[p] as they are. Lane l
  // addresses key row r = l % 8 + 8 ((l / 8) % 2) of the warp's 16, chunk 2 p + l / 16: in SW128 the chunk lands at
  // (2 p + l / 16) ^ (r % 8) = (2 p) ^ ((l / 16 ^ r) % 8) with the bit of l / 16 apart from p's, so the address of
  // pair p is this lane's address for p = 0 xor p * 32.
  const int ds_key = wg * 64 + (warp & 3) * 16 + (lane & 7) + 8 * ((lane >> 3) & 1);
  const uint32_t ds_lane = ds_key * kHRowBytes + ((((lane >> 4) ^ ds_key) & 7) << 4);
  // Operand descriptors step from one: the aligned base with leading offset 0 (hopper.cuh, tile()).
  const SteppedDescriptor smem_desc = SteppedDescriptor::at(base, 0, kSwizzleAtomBytes);
  const uint32_t wg_rows = wg * 64 * kHRowBytes;  // this warpgroup's first K / V row (bytes)

  // Step `at`'s stage has landed; varlen: the rows past the sequence are the next one's, or tokens of no sequence
  // (anything, NaN too). Their P^T is masked to 0, their D is finite (bwd_preprocess); zero their Q and dO, so 0
  // times them stays 0 in dS^T, dV and dK.
  auto stage_ready = [&](int at) {
    const int stage = at % kHQStages, m0 = (m_first + at % m_count) * kHBlockM;
    mbarrier_wait(full_bars + 8 * stage, (at / kHQStages) & 1);
    if (cu_q != nullptr && m0 + kHBlockM > sq.y) {
      zero_tile_rows<kHBlockM, kD / 64, kThreads>(q_t + stage * kHQBytes, sq.y - m0, tid);
      zero_tile_rows<kHBlockM, kDv / 64, kThreads>(do_t + stage * kHDoBytes, sq.y - m0, tid);
      fence_proxy_async_shared();
      __syncthreads();
    }
  };
  // S^T (64 keys x kHSubM queries per warpgroup) and, kHScoresAhead, the next step's, issued a step ahead into
  // registers of its own: wgmma accumulators that ordinary instructions also define (P^T is formed in place) make
  // ptxas serialise every wgmma of the kernel.
  float s[kHSubM / 2], s_ahead[kHSubM / 2];
  // S^T = K Q^T of step `at`'s stage (queries q0..): A = this warpgroup's K rows, B = Q read K-major. From an opaque
  // base (see the step's descriptors).
  auto issue_scores = [&](int at, int q0) {  // s_ahead fenced before the first product in flight
    const SteppedDescriptor d = smem_desc.opaque();
    wgmma_fence();
    h_issue_nt<kHSubM, kD, kHBlockN, kHBlockM>(s_ahead, d.tile(k_t - base + wg_rows, 16),
                                               d.tile(q_t - base + (at % kHQStages) * kHQBytes + q0 * kHRowBytes, 16));
    wgmma_commit();
  };

  if (tid == 0) {
#pragma unroll
    for (int st = 0; st < kHQStages; ++st) mbarrier_init(full_bars + 8 * st, 1);  // thread 0's arrival + the bytes
  }
  __syncthreads();  // the mbarriers are initialised before anyone arrives or waits
  StepCursor load_at{hk * group, m_first * kHBlockM};
  if (tid == 0) {
    for (int i = 0; i < kHLoadAhead; ++i) {
      if (i < steps) load_stage(load_at, i);
      advance(load_at);
    }
  }
  cp_async_wait<0>();  // K, V (this thread's copies)
  fence_proxy_async_shared();
  __syncthreads();  // everyone's
  if constexpr (kHScoresAhead) {
    if (steps > 0) {
      stage_ready(0);
      fence_operands(s_ahead);
      issue_scores(0, 0);
      wgmma_wait<0>();
      fence_operands(s_ahead);
    }
  }

  for (int step = 0; step < steps; ++step) {
    const int stage = step % kHQStages;
    const int h = hk * group + step / m_count;
    const int m0 = (m_first + step % m_count) * kHBlockM;
    const uint32_t q_stage = stage * kHQBytes, do_stage = stage * kHDoBytes;  // byte offsets of this step's stage
    if constexpr (!kHScoresAhead) stage_ready(step);  // else when its S^T was issued
    const float* lses = stats_s + stage * (kHStatsBytes / 4) + (sq.x & 3);  // this step's lse2 rows (m0 % 4 = 0)
    const float* dvs = lses + kHStatsRows;  // and its D rows
    const uint32_t ds_cur = ds_t + (step % kHDsBuffers) * kHDsBytes;  // this step's dS^T buffer
    // This step's operand descriptors, each one add from the base: this warpgroup's K / V rows (the A of S^T /
    // dP^T), Q and dO read K-major (the B of S^T / dP^T) and MN-major (the B of dK / dV, leading offset one
    // 64-column sub-tile), dS^T and the K tile read MN-major (dQ's A and B). From an opaque base: hoisted out of the
    // loop as invariants, the 192/128 build's descriptors took registers enough to spill.
    const SteppedDescriptor step_desc = smem_desc.opaque();
    const SteppedDescriptor k_rows = step_desc.tile(k_t - base + wg_rows, 16);
    const SteppedDescriptor v_rows = step_desc.tile(v_t - base + wg_rows, 16);
    const SteppedDescriptor q_kmajor = step_desc.tile(q_t - base + q_stage, 16);
    const SteppedDescriptor do_kmajor = step_desc.tile(do_t - base + do_stage, 16);
    const SteppedDescriptor q_mnmajor = step_desc.tile(q_t - base + q_stage, kHStepSubBytes);
    const SteppedDescriptor do_mnmajor = step_desc.tile(do_t - base + do_stage, kHStepSubBytes);
    const SteppedDescriptor ds_mnmajor = step_desc.tile(ds_t - base, kHDsSubBytes);
    const SteppedDescriptor k_mnmajor = step_desc.tile(k_t - base, kHKBytes);
    const bool full = vis.tile_all_visible(m0, m0 + kHBlockM, n0, n0 + kHBlockN);

    float dp[kHSubM / 2];
    uint32_t p_frag[kHSubM / 16][4], ds_frag[kHSubM / 16][4];
    // After a wgmma_wait: the accumulators and this step's register A fragments are settled values again.
    auto fence_step_operands = [&]() {
      fence_operands(dv_acc);
      fence_operands(dk_acc);
#pragma unroll
      for (int kk = 0; kk < kHSubM / 16; ++kk) {
        fence_operands(p_frag[kk]);
        fence_operands(ds_frag[kk]);
      }
    };
#pragma unroll
    for (int sub = 0; sub < kHSubSteps; ++sub) {
      const int q0 = sub * kHSubM;  // the sub-step's first query within the step
      // ---- S^T (unless issued a step ahead), dP^T (64 keys x kHSubM queries per warpgroup), one wgmma group each
      if constexpr (!kHScoresAhead) {
        fence_operands(s);
        fence_operands(dp);
        wgmma_fence();
        h_issue_nt<kHSubM, kD, kHBlockN, kHBlockM>(s, k_rows, q_kmajor.plus(q0 * kHRowBytes));
        wgmma_commit();
      } else {
#pragma unroll
        for (int i = 0; i < kHSubM / 2; ++i) s[i] = s_ahead[i];
        fence_operands(dp);
        wgmma_fence();
      }
      h_issue_nt<kHSubM, kDv, kHBlockN, kHBlockM>(dp, v_rows, do_kmajor.plus(q0 * kHRowBytes));
      wgmma_commit();
      // One dS^T buffer: both warpgroups' dQ of the previous step has read it (retired) before it is written.
      if (kHDsBuffers == 1 && sub == 0) __syncthreads();
      // dS^T (packed) -> the shared tile dQ reads (SW128, key rows, 64 queries = one 128-byte row per sub-tile;
      // the sub-step's queries 16 p .. lie in sub-tile (q0 + 16 p) / 64, pair ((q0 + 16 p) % 64) / 16 there).
      auto store_ds = [&](int p) {
        const int pair = q0 / 16 + p;  // 16-query pair of chunks within the step
        stmatrix_x4((ds_cur + (pair / 4) * kHDsSubBytes + ds_lane) ^ ((pair % 4) << 5), ds_frag[p]);
      };

      fence_operands(dv_acc);
      fence_operands(dk_acc);
      if constexpr (kHPipelined) {
        // P^T while dP^T is still on the tensor cores, then dV += P^T dO while dS^T is formed.
        wgmma_wait<1>();
        fence_operands(s);
#pragma unroll
        for (int j = 0; j < kHSubM / 8; ++j) {
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const int col = q0 + j * 8 + 2 * t4 + (r & 1);  // query within the step
            const int key = key_w + (r >> 1) * 8;           // key within the block
            float x = exp2f(s[4 * j + r] * scale_log2 - lses[col]);
            if (!full && !vis.visible(m0 + col, n0 + key)) x = 0.f;
            s[4 * j + r] = x;
          }
        }
        h_pack(p_frag, s);
        wgmma_fence();
        h_issue_rs<kDv>(dv_acc, p_frag, do_mnmajor.plus(q0 * kHRowBytes));
        wgmma_commit();
        wgmma_wait<1>();  // dP^T retired (dV may still run)
        fence_operands(dp);
#pragma unroll
        for (int j = 0; j < kHSubM / 8; ++j) {
#pragma unroll
          for (int r = 0; r < 4; ++r)
            dp[4 * j + r] = s[4 * j + r] * (dp[4 * j + r] - dvs[q0 + j * 8 + 2 * t4 + (r & 1)]);
        }
        h_pack(ds_frag, dp);
#pragma unroll
        for (int p = 0; p < kHSubM / 16; ++p) store_ds(p);
        wgmma_fence();
        h_issue_rs<kD>(dk_acc, ds_frag, q_mnmajor.plus(q0 * kHRowBytes));
        wgmma_commit();
      } else {
        // Softcap: 1 - tanh^2 of each score is needed for dS^T, so P^T and dS^T are formed in one pass.
        wgmma_wait<0>();
        fence_operands(s);
        fence_operands(dp);
#pragma unroll
        for (int j = 0; j < kHSubM / 8; ++j) {
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const int col = q0 + j * 8 + 2 * t4 + (r & 1);
            const int key = key_w + (r >> 1) * 8;
            float dt = 1.f;
            float x = exp2f(sc.logit2<HAS_SOFTCAP != 0>(s[4 * j + r], dt) - lses[col]);
            if (!full && !vis.visible(m0 + col, n0 + key)) x = 0.f;
            s[4 * j + r] = x;
            dp[4 * j + r] = x * (dp[4 * j + r] - dvs[col]) * dt;
          }
          if (j % 2 == 1) {  // a 16-query pair done: its dS^T fragment packed and stored (fewer live fp32 values)
            h_pack_step(ds_frag[j / 2], dp, j / 2);
            store_ds(j / 2);
          }
        }
        h_pack(p_frag, s);
        wgmma_fence();
        h_issue_rs<kDv>(dv_acc, p_frag, do_mnmajor.plus(q0 * kHRowBytes));
        h_issue_rs<kD>(dk_acc, ds_frag, q_mnmajor.plus(q0 * kHRowBytes));
        wgmma_commit();
      }
      fence_operands(dv_acc);
      fence_operands(dk_acc);
      if constexpr (kHSubSteps > 1) {
        wgmma_wait<0>();  // this sub-step's dV / dK retired: the next one's S^T / dP^T take their registers
        fence_step_operands();
      }
    }

    fence_proxy_async_shared();  // dS^T written by plain stores, read by the tensor cores
    if constexpr (kHDqTma) {  // the previous step's dQ boxes read by the TMA: after (B) they may be rewritten
      if ((tid & 127) == 0) tma::bulk_wait_read<0>();
    }
    __syncthreads();  // (B) both halves
    // Both warpgroups are past (B) of this step, so done with step - 1: its stage takes step + kHLoadAhead.
    if (tid == 0) {
      if (step + kHLoadAhead < steps) load_stage(load_at, (step + kHLoadAhead) % kHQStages);
      advance(load_at);
    }
    if constexpr (kHRetireBeforeDq) {
      wgmma_wait<0>();  // retire dV / dK first: their A fragments die before dQ's accumulators are born
      fence_step_operands();
    }

    // ---- dQ = dS K: A = dS^T tile (MN-major), B = K tile (MN-major), in rounds of 64 columns
    // ---- every step, both warpgroups: d128 its 64 columns, d64 its 64 query rows; 192/128 one warpgroup columns
    // ---- 0-63 and 128-191 (two rounds, one after the other: 64 accumulators would not fit next to dK / dV), the
    // ---- other 64-127, swapping shares from step to step
    const bool dq_wide = kHValueOwn && ((wg + step) & 1) == 0;
    const SteppedDescriptor ds_rows =  // this step's buffer; kHDqRows: this warpgroup's queries
        ds_mnmajor.plus((step % kHDsBuffers) * kHDsBytes + (kHDqRows ? wg_rows / (64 * kHRowBytes) : 0) * kHDsSubBytes);
    const int q_row = (kHDqRows ? wg * 64 : 0) + (warp & 3) * 16 + g;      // query within the step
    const int64_t ws_row = (int64_t(bw) * heads + h) * rows_pad + sq.x + m0 + q_row;
#pragma unroll
    for (int round = 0; round < kHDqRounds; ++round) {
      if (round > 0 && !dq_wide) break;
      const int col_tile = kHValueOwn ? (round > 0 ? 2 : dq_wide ? 0 : 1) : kHDqSplit ? wg : 0;  // 64-column block
      float dq[32];
      fence_operands(dq);
      if constexpr (kHScoresAhead) fence_operands(s_ahead);  // the next step's S^T, issued while dQ runs
      wgmma_fence();
      h_issue_dq(dq, ds_rows, k_mnmajor.plus(col_tile * kHKSubBytes));
      wgmma_commit();
      if constexpr (kHScoresAhead) {
        if (step + 1 < steps) {  // uniform
          stage_ready(step + 1);
          issue_scores(step + 1, 0);
          wgmma_wait<1>();  // dQ retired; the next S^T runs on under dQ's trip to the TMA
        } else {
          wgmma_wait<0>();
        }
      } else {
        wgmma_wait<0>();  // dV, dK and dQ retired: their register operands may be reused
      }
      if constexpr (!kHScoresAhead) fence_step_operands();  // else retired and fenced before dQ (kHRetireBeforeDq)
      fence_operands(dq);
      if constexpr (kHDqTma) {
        // rows q_row, q_row + 8 (past the sequence: zeros, the box adds them to rows that exist; only a step at the
        // sequence's end, a uniform branch, has such rows); column 8 j + 2 t4 lies in box j / 4, 16-byte chunk
        // 2 (j % 4) + t4 / 2, swizzled by the row (q_row + 8 has q_row's)
        if (m0 + kHBlockM > sq.y) {
          const bool row_in = m0 + q_row < sq.y, row8_in = m0 + q_row + 8 < sq.y;
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            dq[4 * j] = row_in ? dq[4 * j] : 0.f;
            dq[4 * j + 1] = row_in ? dq[4 * j + 1] : 0.f;
            dq[4 * j + 2] = row8_in ? dq[4 * j + 2] : 0.f;
            dq[4 * j + 3] = row8_in ? dq[4 * j + 3] : 0.f;
          }
        }
        const uint32_t boxes = dq_t + wg * (2 * kHDqBoxBytes);
        const int box_row = (warp & 3) * 16 + g;  // q_row within this warpgroup's 64 rows
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const uint32_t at = boxes + (j / 4) * kHDqBoxBytes + box_row * 128 +
                              (((2 * (j % 4) + (t4 >> 1)) ^ (box_row & 7)) * 16) + 8 * (t4 & 1);
          st_shared_f32x2(at, dq[4 * j], dq[4 * j + 1]);
          st_shared_f32x2(at + 8 * 128, dq[4 * j + 2], dq[4 * j + 3]);
        }
        fence_proxy_async_shared();
        named_barrier_sync(1 + wg, 128);  // this warpgroup's two boxes written
        if ((tid & 127) == 0) {
          const int row = sq.x + m0 + (kHDqRows ? wg * 64 : 0);  // this warpgroup's first query row
          tma::reduce_add_box(dq_map, boxes, col_tile * 64, row, h, bw);
          tma::reduce_add_box(dq_map, boxes + kHDqBoxBytes, col_tile * 64 + 32, row, h, bw);
          tma::bulk_commit();
        }
        continue;
      }
      float* dst = dq_accum + ws_row * kD + col_tile * 64 + 2 * t4;  // + 8 j: column block j
      if (m0 + kHBlockM <= sq.y) {  // every row of the step inside the sequence (uniform): base + immediate
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          red_add_f32x2(dst + j * 8, dq[4 * j], dq[4 * j + 1]);
          red_add_f32x2(dst + 8 * kD + j * 8, dq[4 * j + 2], dq[4 * j + 3]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (m0 + q_row < sq.y) red_add_f32x2(dst + j * 8, dq[4 * j], dq[4 * j + 1]);
          if (m0 + q_row + 8 < sq.y) red_add_f32x2(dst + 8 * kD + j * 8, dq[4 * j + 2], dq[4 * j + 3]);
        }
      }
    }
    if constexpr (kHScoresAhead) {
      wgmma_wait<0>();  // the next step's S^T retired here: no product is in flight across the loop's back edge
      fence_operands(s_ahead);
    }
  }

  // dK (batch, seqlen_k, kv_heads, D), dV (batch, seqlen_k, kv_heads, D_v) contiguous; dK carries the softmax
  // scale of s = scale * q.k. They leave through the Q / dO stages, free once both warpgroups' last products
  // retired: each warp stages its 16 key rows (stage_warp_rows) and stores them out in 16-byte chunks of whole rows.
  static_assert(kHKBytes + kHVBytes <= kHQStages * (kHQBytes + kHDoBytes), "dK and dV staged in the Q / dO stages");
  __syncthreads();  // both warpgroups' last products retired: the stages are free
  const int warp_key0 = wg * 64 + (warp & 3) * 16;  // this warp's first key row within the tile
  const int64_t tok0 = (cu_k == nullptr ? int64_t(b) * seqlen_k : int64_t(sk.x)) + n0 + warp_key0;
  // Rows [warp_key0, warp_key0 + 16) of a (tokens, kv_heads, kCols) gradient from its accumulator, times `scale`.
  auto store_rows = [&](T* grad, uint32_t staging, const auto& acc, auto cols, float scale) {
    constexpr int kCols = decltype(cols)::value;
    const uint32_t tile = staging + warp_key0 * (kCols * 2);
    stage_warp_rows<kBf16, kCols>(tile, acc, scale, scale, lane);
    __syncwarp();
    T* const row0 = grad + (tok0 * kv_heads + hk) * kCols;
    copy_warp_rows<kCols>(tile, lane, [&](int r) -> void* {
      return n0 + warp_key0 + r < sk.y ? row0 + int64_t(r) * kv_heads * kCols : nullptr;
    });
  };
  store_rows(dk, q_t, dk_acc, std::integral_constant<int, kD>{}, softmax_scale);
  store_rows(dv, q_t + kHKBytes, dv_acc, std::integral_constant<int, kDv>{}, 1.f);
  // The last dQ boxes read before the block's shared memory goes (after the stores, so that they overlap). Their
  // additions into the workspace complete before the grid does, so the block need not wait for them to land.
  if constexpr (kHDqTma) {
    if ((tid & 127) == 0) tma::bulk_wait_read<0>();
  }
}

}  // namespace bwd
}  // namespace hfp
