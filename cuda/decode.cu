// hf_flashpatch: split-KV decode attention over a contiguous, paged (block table) or slot-indexed
// KV cache. Memory bound: every byte of K/V is read once per (sequence, KV head, row tile) and the
// work is arranged to keep many 16-byte loads in flight.
//
// Layout: q (B, S_q, H, D) (or packed (T_q, H, D) with cu_seqlens_q), K rows of D and V rows of D_v, out
// (B, S_q, H, D_v) likewise, lse (B, H, S_q) fp32 (any strides). K/V addressing is chosen at compile time
// (decode_kv_address.cuh).
//
// Work split:
//   grid  = (row_tiles * num_splits, H_kv, B), block = 4 warps.
//   rows  = the S_q * group query rows of one KV head, token-major (row r = token r / group, head
//           r % group); a CTA owns 16 rows (one mma M tile), so all query heads of a GQA group and
//           all S_q tokens share each K/V tile load.
//   keys  = the CTA's visible key range is cut into num_splits chunks (split-KV, for small B*H_kv);
//           inside a chunk, warp w takes 16-key tiles w, w+4, w+8, ... through its own cp.async
//           pipeline (STAGES deep, no CTA barrier in the loop), keeps its own online-softmax state,
//           and the four warp states are merged through shared memory at the end.
//   out   = num_splits == 1: normalised output + lse written directly; else per-split (o, lse) go to
//           an fp32 workspace (split, flat token, head) merged by hfp_decode_combine.
//
// Compile-time configuration: decode_common.cuh. The split merge: decode_combine.cuh.
#include <type_traits>

#include "decode_common.cuh"
#include "decode_combine.cuh"

namespace hfp {

// A pointer held by lane `src_lane` (every lane of the warp must call this).
template <typename T>
__device__ __forceinline__ const T* shfl_pointer(const T* ptr, int src_lane) {
  const unsigned long long bits = reinterpret_cast<unsigned long long>(ptr);
  return reinterpret_cast<const T*>(__shfl_sync(0xffffffffu, bits, src_lane));
}

// One CTA's work on 16 query rows [first_row, first_row + 16) of (sequence b, kv_head), keys of
// split `split`.
__device__ __forceinline__ void decode_row_tile(const DecodeParams& p, int b, int kv_head, int split, int q_begin,
                                                int n_q, int seqlen_k, int first_row) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Elem* smem_q = reinterpret_cast<Elem*>(smem_raw);           // [16][D]
  Elem* smem_kv = smem_q + kRows * kHeadDim;                 // [warps][STAGES][K tile, V tile]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = p.heads / p.kv_heads;
  const int rows_valid = min(kRows, n_q * group - first_row);

  // Visible key range of the tile's rows (bottom-right aligned: token i sits at key i + L - n_q).
  const int shift = seqlen_k - n_q;
  const int pos_first = first_row / group + shift, pos_last = (first_row + rows_valid - 1) / group + shift;
  const WindowShifts window = window_shifts(0, p.window_left, p.window_right);  // pos already holds the shift
  int k_lo = max(p.kv.key_start(b), row_key_range<true>(pos_first, window, seqlen_k).lo);
  int k_hi = max(row_key_range<true>(pos_last, window, seqlen_k).hi, k_lo);
  // Split the range in chunks that are whole multiples of the CTA's 64-key stride.
  const int span = k_hi - k_lo;
  const int chunk = ((span + p.num_splits - 1) / p.num_splits + kWarps * kTileKeys - 1) / (kWarps * kTileKeys) *
                    (kWarps * kTileKeys);
  const int k_begin = min(k_hi, k_lo + split * chunk), k_end = min(k_hi, k_begin + chunk);
#if PAGE_TILES
  // Tiles start at k_begin + 16 n: with whole tiles per page, each tile is rows [in_page, in_page + 16)
  // of one page (windows can start the chunk mid-tile: then the per-key form below is used).
  const bool page_tiles = p.kv.page_size % kTileKeys == 0 && k_begin % kTileKeys == 0;
#else
  [[maybe_unused]] constexpr bool page_tiles = false;
#endif

  // ---- Q rows -> shared memory (zero for rows past the valid ones)
  for (int c = threadIdx.x; c < kRows * kChunks; c += kWarps * 32) {
    const int r = c / kChunks, ch = c % kChunks;
    const int row = first_row + r;
    const bool valid = r < rows_valid;
    const int tok = valid ? row / group : 0, head = kv_head * group + (valid ? row % group : 0);
    const long long batch_off = p.cu_seqlens_q ? 0 : (long long)b * p.q_stride_b;
    const Elem* src = p.q + batch_off + (long long)(q_begin + tok) * p.q_stride_s + (long long)head * p.q_stride_h + ch * 8;
    cp_async_16(smem_addr(smem_q + tile_offset<kHeadDim>(r, ch)), src, valid);
  }
  cp_async_commit();  // group 0: Q (waited for before the loop, below)

  // ---- per-warp pipelined loop over 16-key tiles
  Elem* warp_kv = smem_kv + warp * STAGES * kStageElems;
  const int n_tiles_cta = (k_end - k_begin + kTileKeys - 1) / kTileKeys;
  const int n_tiles = n_tiles_cta > warp ? (n_tiles_cta - warp + kWarps - 1) / kWarps : 0;
  // Lane l (and l + 16) locates key l % 16 of a tile once; the copies' row addresses come from it.
  const int load_key = lane % 16;
  // The tile iteration `it` of this warp processes: tiles in order. An identity, but kept as a function:
  // writing `it` in its place changes what nvcc 13.0 emits (scripts/check_shipped_cubins.py).
  auto tile_of = [](int it) { return it; };

  // This lane's key in the warp's tile `it` (< n_tiles), clamped into the chunk like the copies do.
  // page_tiles: the tile's first key for every lane (its page places the whole tile).
  auto lane_key = [&](int it) {
    const int key0 = k_begin + (warp + tile_of(it) * kWarps) * kTileKeys;
    if (page_tiles) return key0;
    const int key = key0 + load_key;
    return key < k_end ? key : k_begin;
  };
  // The page / slot table entry of this lane's key in the next tile to issue, loaded one issue_tile call
  // early so that a tile's copies never wait on the dependent table read.
  using Entry = typename KvAddressT<Elem>::Entry;
  Entry entry_ahead = 0 < n_tiles ? p.kv.entry(b, lane_key(0)) : Entry(0);

#if KV_ADDRESSING == 0
  // Contiguous: key j's rows lie j rows past key 0's, so the (sequence, head) part of every row address is
  // one base per CTA and a row costs one multiply-add of its key, taken unsigned (no sign extension).
  // locate() per row would be the same address, but nvcc adds the head offset back into every row's.
  long long k_off0, v_off0;
  p.kv.locate(b, 0, k_off0, v_off0);
  const Elem* k_seq = p.kv.k + k_off0 + (long long)kv_head * p.kv.k_stride2;
  const Elem* v_seq = p.kv.v + v_off0 + (long long)kv_head * p.kv.v_stride2;
#endif
  auto issue_tile = [&](int it) {
    const int slot = it % STAGES;
    if (it < n_tiles) {
      // Copy instruction i covers the 32 consecutive 16-byte chunks e = 32 i + lane of the tile (row
      // e / kChunks, chunk e % kChunks): whole rows per instruction.
      const int key0 = k_begin + (warp + tile_of(it) * kWarps) * kTileKeys;
      Elem* k_dst = warp_kv + slot * kStageElems;
      Elem* v_dst = k_dst + kKTileElems;
#if KV_ADDRESSING != 0
      // This lane's key (clamped into the chunk), or with page_tiles the tile's first key, whose row
      // address plus r rows places row r of the tile.
      const int my_key = page_tiles ? key0 : (key0 + load_key < k_end ? key0 + load_key : k_begin);
      long long k_off, v_off;
      p.kv.locate_entry(entry_ahead, b, my_key, k_off, v_off);
      const Elem* k_mine = p.kv.k + k_off + (long long)kv_head * p.kv.k_stride2;
      const Elem* v_mine = p.kv.v + v_off + (long long)kv_head * p.kv.v_stride2;
#endif
      // ArithRows (page_tiles): row r of the tile is r rows after the tile's first key in its page.
      // A template argument rather than a branch per row, so each form is one straight-line loop.
      // Copy instruction i of K (i < kChunks / 2) and of V (i < kChunksV / 2); with one head dim the two
      // share the row arithmetic.
      auto copy_rows = [&](auto arith_rows) {
        constexpr bool kArithRows = decltype(arith_rows)::value;
        (void)kArithRows;
        // The row address of `row` in K (kIsV false) or V: whole-tile copies read it from this lane's own
        // key (kArithRows) or from the lane holding it.
        auto row_address = [&](auto is_v, int row, bool valid) -> const Elem* {
          constexpr bool kIsV = decltype(is_v)::value;
          (void)valid;
#if KV_ADDRESSING == 0
          // Contiguous: the row address is plain arithmetic, no shuffle needed.
          const unsigned long long key = (unsigned)(valid ? key0 + row : k_begin);  // keys are >= 0
          return kIsV ? v_seq + key * p.kv.v_stride1 : k_seq + key * p.kv.k_stride1;
#else
          if constexpr (kArithRows) {
            // Rows past k_end are still inside the tile's page (page_size is a multiple of 16) and
            // are zero-filled, never read.
            return kIsV ? v_mine + row * p.kv.v_stride1 : k_mine + row * p.kv.k_stride1;
          } else {
            // Lanes row and row + 16 both hold key key0 + row (invalid keys hold key k_begin: in range).
            return shfl_pointer(kIsV ? v_mine : k_mine, row);
          }
#endif
        };
        constexpr int kSteps = (kChunks > kChunksV ? kChunks : kChunksV) / 2;
#pragma unroll
        for (int i = 0; i < kSteps; ++i) {
          const bool has_k = i < kChunks / 2, has_v = i < kChunksV / 2;  // compile-time once unrolled
          const int e = i * 32 + lane;
          const int k_row_index = e / kChunks, k_chunk = e % kChunks, v_row_index = e / kChunksV, v_chunk = e % kChunksV;
          const bool k_valid = key0 + k_row_index < k_end, v_valid = key0 + v_row_index < k_end;
          // Both addresses before both copies (with one head dim: the same row, one shuffle pair per instruction).
          const Elem* k_row = has_k ? row_address(std::false_type{}, k_row_index, k_valid) : nullptr;
          const Elem* v_row = has_v ? row_address(std::true_type{}, v_row_index, v_valid) : nullptr;
          if (has_k) cp_async_16(smem_addr(k_dst + tile_offset<kHeadDim>(k_row_index, k_chunk)), k_row + k_chunk * 8, k_valid);
          if (has_v) cp_async_16(smem_addr(v_dst + tile_offset<kHeadDimV>(v_row_index, v_chunk)), v_row + v_chunk * 8, v_valid);
        }
      };
      if (page_tiles) {  // uniform over the CTA
        copy_rows(std::true_type{});
      } else {
        copy_rows(std::false_type{});
      }
      // The next call's entry: its load is issued now and not waited for until then.
      entry_ahead = it + 1 < n_tiles ? p.kv.entry(b, lane_key(it + 1)) : Entry(0);
    }
    cp_async_commit();  // always commit: keeps the wait_group counting uniform
  };

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) issue_tile(s);
  cp_async_wait<STAGES - 1>();  // the Q group is complete (only the K/V prologue may be in flight)
  __syncthreads();              // ... for every warp's view of shared Q

  // mma fragment coordinates: lane = 4 * g + t; this thread holds rows g and g + 8.
  const int g = lane / 4, t = lane % 4;
  // Q A-fragment of k-step kk: matrices (rows 0-7, c), (rows 8-15, c), (rows 0-7, c+1), (rows 8-15, c+1).
  auto load_q_fragment = [&](uint32_t (&a)[4], int kk) {
    const int mi = lane / 8, r = (mi & 1) * 8 + lane % 8, ch = kk * 2 + (mi >> 1);
    ldmatrix_x4(a, smem_addr(smem_q + tile_offset<kHeadDim>(r, ch)));
  };
  float o_acc[kHeadDimV / 8][4];
#pragma unroll
  for (int n = 0; n < kHeadDimV / 8; ++n) o_acc[n][0] = o_acc[n][1] = o_acc[n][2] = o_acc[n][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};  // running max of scores (log2 domain) of rows g, g+8
  float row_sum[2] = {0.f, 0.f};              // running sum of 2^(score - row_max)

  // Per-row visible keys of this CTA's chunk, [vis_lo, vis_lo + vis_len): the row's range cut at k_end; rows
  // past rows_valid see none (vis_len 0). Final before the loop, so a score costs one compare: a bound the
  // loop still had to combine with k_end or the row's validity is one nvcc recomputed from the window
  // for every score instead of keeping it in a register.
  int vis_lo[2], vis_len[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = g + half * 8;
    const int pos = (first_row + r) / group + shift;
    const RowKeyRange keys = row_key_range<true>(pos, window, seqlen_k);
    vis_lo[half] = keys.lo;
    vis_len[half] = r < rows_valid ? max(min(keys.hi, k_end) - keys.lo, 0) : 0;
  }

  for (int it = 0; it < n_tiles; ++it) {
    cp_async_wait<STAGES - 2>();
    __syncwarp();  // every lane's copies of tile `it` landed; slot (it - 1) % STAGES is free again
    issue_tile(it + STAGES - 1);

    const Elem* k_tile = warp_kv + (it % STAGES) * kStageElems;
    const Elem* v_tile = k_tile + kKTileElems;

    // S (16 rows x 16 keys) = Q K^T: two n8 blocks, HEAD_DIM / 16 k-steps.
    float s_acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t a[4], kb[4];
      load_q_fragment(a, kk);
      {  // K B-fragments: (keys 0-7, c), (keys 0-7, c+1), (keys 8-15, c), (keys 8-15, c+1)
        const int mi = lane / 8, r = (mi >> 1) * 8 + lane % 8, ch = kk * 2 + (mi & 1);
        ldmatrix_x4(kb, smem_addr(k_tile + tile_offset<kHeadDim>(r, ch)));
      }
      const uint32_t b0[2] = {kb[0], kb[1]}, b1[2] = {kb[2], kb[3]};
      mma_16816<ELEM_BF16 != 0>(s_acc[0], a, b0);
      mma_16816<ELEM_BF16 != 0>(s_acc[1], a, b1);
    }

    // Scale (+ softcap) into the log2 domain, mask, online softmax update.
    const int key0 = k_begin + (warp + tile_of(it) * kWarps) * kTileKeys;
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nb = 0; nb < 2; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int half = e / 2, key = key0 + nb * 8 + 2 * t + (e & 1);
        float s = p.scores.logit2<SOFTCAP != 0>(s_acc[nb][e]);
        // A key below vis_lo wraps to a large unsigned difference (keys and bounds stay far below 2^31).
        const bool visible = (unsigned)(key - vis_lo[half]) < (unsigned)vis_len[half];
        s = visible ? s : -INFINITY;
        s_acc[nb][e] = s;
        tile_max[half] = fmaxf(tile_max[half], s);
      }
    }
    float rescale[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float new_max = fmaxf(row_max[half], quad_max(tile_max[half]));
      // A row with nothing visible so far keeps max -inf; use 0 as the exponent base so that
      // exp2(-inf - 0) = 0 instead of NaN.
      const float base = new_max == -INFINITY ? 0.f : new_max;
      rescale[half] = exp2f(row_max[half] - base);
      row_max[half] = new_max;
      float tile_sum = 0.f;
#pragma unroll
      for (int nb = 0; nb < 2; ++nb) {
        s_acc[nb][2 * half] = exp2f(s_acc[nb][2 * half] - base);
        s_acc[nb][2 * half + 1] = exp2f(s_acc[nb][2 * half + 1] - base);
        tile_sum += s_acc[nb][2 * half] + s_acc[nb][2 * half + 1];
      }
      row_sum[half] = row_sum[half] * rescale[half] + tile_sum;  // quad-partial; reduced at the end
    }
#pragma unroll
    for (int n = 0; n < kHeadDimV / 8; ++n) {
      o_acc[n][0] *= rescale[0];
      o_acc[n][1] *= rescale[0];
      o_acc[n][2] *= rescale[1];
      o_acc[n][3] *= rescale[1];
    }

    // O (16 x D_v) += P (16 x 16 keys) V (16 keys x D_v). P's C-fragment is already the A layout.
    uint32_t pa[4];
    pa[0] = Traits::pack2(s_acc[0][0], s_acc[0][1]);
    pa[1] = Traits::pack2(s_acc[0][2], s_acc[0][3]);
    pa[2] = Traits::pack2(s_acc[1][0], s_acc[1][1]);
    pa[3] = Traits::pack2(s_acc[1][2], s_acc[1][3]);
#pragma unroll
    for (int dc = 0; dc < kHeadDimV / 16; ++dc) {
      // V^T B-fragments: (keys 0-7, c), (keys 8-15, c), (keys 0-7, c+1), (keys 8-15, c+1), c = 2 * dc
      uint32_t vb[4];
      const int mi = lane / 8, r = (mi & 1) * 8 + lane % 8, ch = dc * 2 + (mi >> 1);
      ldmatrix_x4_trans(vb, smem_addr(v_tile + tile_offset<kHeadDimV>(r, ch)));
      const uint32_t b0[2] = {vb[0], vb[1]}, b1[2] = {vb[2], vb[3]};
      mma_16816<ELEM_BF16 != 0>(o_acc[2 * dc], pa, b0);
      mma_16816<ELEM_BF16 != 0>(o_acc[2 * dc + 1], pa, b1);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // all warps done with their pipelines: the K/V buffers can be reused for the merge

  // ---- merge the four warp states through shared memory
  // Region layout (fp32): o [warps][16][D_v], max [warps][16], sum [warps][16].
  float* merge_o = reinterpret_cast<float*>(smem_kv);
  float* merge_max = merge_o + kWarps * kRows * kHeadDimV;
  float* merge_sum = merge_max + kWarps * kRows;
#pragma unroll
  for (int half = 0; half < 2; ++half) row_sum[half] = quad_sum(row_sum[half]);
#pragma unroll
  for (int n = 0; n < kHeadDimV / 8; ++n) {
    float* base = merge_o + warp * kRows * kHeadDimV + n * 8 + 2 * t;
    *reinterpret_cast<float2*>(base + g * kHeadDimV) = make_float2(o_acc[n][0], o_acc[n][1]);
    *reinterpret_cast<float2*>(base + (g + 8) * kHeadDimV) = make_float2(o_acc[n][2], o_acc[n][3]);
  }
  if (t == 0) {
    merge_max[warp * kRows + g] = row_max[0];
    merge_max[warp * kRows + g + 8] = row_max[1];
    merge_sum[warp * kRows + g] = row_sum[0];
    merge_sum[warp * kRows + g + 8] = row_sum[1];
  }
  __syncthreads();

  // Each thread finishes (row, 4 consecutive dims) pieces of the 16 x D_v output tile.
  constexpr float kLn2 = 0.6931471805599453f;
  for (int idx = threadIdx.x; idx < kRows * (kHeadDimV / 4); idx += kWarps * 32) {
    const int r = idx / (kHeadDimV / 4), d = (idx % (kHeadDimV / 4)) * 4;
    if (r >= rows_valid) continue;
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, merge_max[w * kRows + r]);
    const float base = m == -INFINITY ? 0.f : m;
    float sum = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float f = exp2f(merge_max[w * kRows + r] - base);
      sum += merge_sum[w * kRows + r] * f;
      const float4 o = *reinterpret_cast<const float4*>(merge_o + (w * kRows + r) * kHeadDimV + d);
      acc.x += o.x * f, acc.y += o.y * f, acc.z += o.z * f, acc.w += o.w * f;
    }
    // Rows that see nothing (sum 0): zeros, lse -inf. A NaN score (NaN in q or k) makes sum NaN, which
    // must stay NaN: `sum > 0` would be false for it and turn the row into "saw nothing".
    const bool seen = sum != 0.f;
    const float inv = seen ? 1.f / sum : 0.f;
    const float lse = seen ? (m + log2f(sum)) * kLn2 : -INFINITY;
    const int row = first_row + r, tok = row / group, head = kv_head * group + row % group;
    if (p.num_splits == 1) {
      const long long batch_off = p.cu_seqlens_q ? 0 : (long long)b * p.out_stride_b;
      Elem* dst = p.out + batch_off + (long long)(q_begin + tok) * p.out_stride_s + (long long)head * p.out_stride_h + d;
      uint2 packed;
      packed.x = Traits::pack2(acc.x * inv, acc.y * inv);
      packed.y = Traits::pack2(acc.z * inv, acc.w * inv);
      *reinterpret_cast<uint2*>(dst) = packed;
      if (d == 0) {
        const long long lb = p.cu_seqlens_q ? 0 : (long long)b * p.lse_stride_b;
        p.lse[lb + (long long)head * p.lse_stride_h + (long long)(q_begin + tok) * p.lse_stride_s] = lse;
      }
    } else {
      // Workspace rows are (split, flat token, head).
      const long long ws_row = ((long long)split * p.total_q + flat_token(p, b, q_begin, tok)) * p.heads + head;
      *reinterpret_cast<float4*>(p.o_part + ws_row * kHeadDimV + d) =
          make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
      if (d == 0) p.lse_part[ws_row] = lse;
    }
  }
}

// A CTA serves row tiles t0, t0 + row_tiles, ... of its sequence, so the grid needs no host
// knowledge of how many queries each packed sequence holds (decode: one tile, one pass).
__device__ __forceinline__ void decode_split(const DecodeParams& p) {
  const int tile0 = blockIdx.x % p.row_tiles, split = blockIdx.x / p.row_tiles;
  const int kv_head = blockIdx.y, b = blockIdx.z;
  const int group = p.heads / p.kv_heads;
  int q_begin, n_q;
  sequence_queries(p, b, q_begin, n_q);
  const int seqlen_k = p.kv.seqlen(b);
  for (int tile = tile0; tile * kRows < n_q * group; tile += p.row_tiles) {
    if (tile != tile0) __syncthreads();  // the previous tile's merge reads of shared memory are done
    decode_row_tile(p, b, kv_head, split, q_begin, n_q, seqlen_k, tile * kRows);
  }
}

}  // namespace hfp

namespace hfp {
// The split kernel's dynamic shared memory: the Q tile, then STAGES (K tile, V tile) pairs per warp.
constexpr int kSplitSharedBytes = (kRows * kHeadDim + kWarps * STAGES * kStageElems) * 2;
// Its resident CTAs per SM as the split heuristic plans them (kernels/heuristics.py ctas_per_sm: Hopper's
// 228 KB per SM, 1 KB reserved per CTA, at most 4). The launch bounds hold ptxas to registers that keep
// that residency: left free, it keeps loop-invariant addresses in registers past the count where they
// cost a resident CTA (D = 64: 4 CTAs need <= 128).
constexpr int kSplitCtasPerSm = (228 * 1024) / (kSplitSharedBytes + 1024) < 4 ? (228 * 1024) / (kSplitSharedBytes + 1024) : 4;
}  // namespace hfp

// Read by the launch from the compiled module (Kernel.shared_bytes).
extern "C" __constant__ int hfp_decode_split_shared_bytes = hfp::kSplitSharedBytes;

// Both kernels take the one parameter struct (cuda/decode_common.cuh; hf_flashpatch/kernels/decode.py
// packs one buffer for the pair).
extern "C" __global__ void __launch_bounds__(hfp::kWarps * 32, hfp::kSplitCtasPerSm)
    hfp_decode_split(const __grid_constant__ hfp::DecodeParams p) {
  hfp::decode_split(p);
}

extern "C" __global__ void __launch_bounds__(128) hfp_decode_combine(const __grid_constant__ hfp::DecodeParams p) {
  hfp::decode_combine(p);
}
