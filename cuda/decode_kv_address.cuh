// hf_flashpatch: where key j of sequence b lives, for the three KV cache forms the decode kernel
// reads. One concept: K/V row addressing; the attention math never sees which form it is.
//
//   KV_ADDRESSING 0  contiguous  k (B, S_cache, H_kv, D) any strides; seqlen = seqlens[b] or S_cache
//   KV_ADDRESSING 1  block table k (num_pages, page_size, H_kv, D); page = table[b][j / page_size]
//   KV_ADDRESSING 2  slot table  k (num_slots, H_kv, D); slot = slots[cu_seqlens_k[b] + j] (int64)
//
// Every K/V table read happens here and is clamped: lengths into [0, default_seqlen], page ids and
// slots into [0, num_rows) (an invalid one reads row 0), key starts to >= 0. So no table content can
// make the kernel touch memory outside the tensors passed (packed q's cu_seqlens_q: decode_common.cuh);
// invalid tables are rejected on the host when the API's content checks run (hf_flashpatch/validate.py).
#pragma once
#include <stdint.h>

#include "primitives.cuh"


namespace hfp {

template <typename Elem>
struct KvAddressT {
  const Elem* k;
  const Elem* v;
  long long k_stride0, k_stride1, k_stride2;  // (batch | page, token | slot-in-page | slot, head) in elements
  long long v_stride0, v_stride1, v_stride2;
  const int* seqlens;          // (B,) valid keys per sequence, or nullptr (contiguous: all S_cache)
  const int* key_starts;       // contiguous: (B,) first visible key per sequence (left padding), or nullptr (0)
  int default_seqlen;          // the most keys a sequence can have, and the bound every length is clamped to:
                               // S_cache (contiguous; also the length without seqlens), max_pages * page_size
                               // (block table), total_k = entries of slots (slot table); 0 for an empty pool
  const void* index;           // int32 page table (B, index_stride) | int64 slots (total_k,)
  long long index_stride;      // page table row stride
  int page_size;
  const int* cu_seqlens_k;     // slot form: (B + 1,)
  int num_rows;                // rows a page id (block table: num_pages) or slot (slot table: num_slots) may name

  __device__ __forceinline__ int seqlen(int b) const {
#if KV_ADDRESSING == 2
    return packed_span(cu_seqlens_k, b, default_seqlen).y;
#elif KV_ADDRESSING == 1
    return min(max(seqlens[b], 0), default_seqlen);
#else
    return seqlens != nullptr ? min(max(seqlens[b], 0), default_seqlen) : default_seqlen;
#endif
  }

  // Keys [key_start(b), seqlen(b)) are visible; the queries are the last tokens before seqlen(b).
  // (A negative start is 0; one past seqlen(b) leaves the range empty, see decode_row_tile.)
  __device__ __forceinline__ int key_start(int b) const { return key_starts != nullptr ? max(key_starts[b], 0) : 0; }

#if KV_ADDRESSING == 2
  using Entry = long long;  // a slot
#else
  using Entry = int;  // a page (block table); unused (0) for the contiguous form
#endif

  // The index-table entry that places key j of sequence b: its page (block table) or slot (slot
  // table), as stored; contiguous caches have no table (0). Separate from locate_entry so that a
  // caller can issue this dependent global load a tile early (decode.cu does) and use it later.
  __device__ __forceinline__ Entry entry(int b, int j) const {
#if KV_ADDRESSING == 0
    (void)b, (void)j;
    return 0;
#elif KV_ADDRESSING == 1
    return static_cast<const int*>(index)[(long long)b * index_stride + j / page_size];
#else
    const int begin = min(max(cu_seqlens_k[b], 0), default_seqlen);  // as in seqlen(b)
    return static_cast<const long long*>(index)[begin + j];
#endif
  }

  // Offsets (elements) of the first k/v element of (b, key j, kv head h) as (row, head) components,
  // given entry(b, j). An entry outside [0, num_rows) places row 0. The clamp sits here, where the
  // entry is used, not in entry(): there it would wait for the load that decode.cu issues a tile
  // early (notes/decode.md).
  __device__ __forceinline__ void locate_entry(Entry e, int b, int j, long long& k_off, long long& v_off) const {
#if KV_ADDRESSING == 0
    (void)e;
    k_off = (long long)b * k_stride0 + (long long)j * k_stride1;
    v_off = (long long)b * v_stride0 + (long long)j * v_stride1;
#elif KV_ADDRESSING == 1
    (void)b;
    const int page = (unsigned)e < (unsigned)num_rows ? e : 0;
    const int in_page = j % page_size;
    k_off = (long long)page * k_stride0 + (long long)in_page * k_stride1;
    v_off = (long long)page * v_stride0 + (long long)in_page * v_stride1;
#else
    (void)b, (void)j;
    const long long slot = (unsigned long long)e < (unsigned long long)num_rows ? e : 0;
    k_off = slot * k_stride1;
    v_off = slot * v_stride1;
#endif
  }

  __device__ __forceinline__ void locate(int b, int j, long long& k_off, long long& v_off) const {
    locate_entry(entry(b, j), b, j, k_off, v_off);
  }
};

}  // namespace hfp
