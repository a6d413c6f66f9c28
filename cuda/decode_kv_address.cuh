// hf_flashpatch: where key j of sequence b lives, for the three KV cache forms the decode kernel
// reads. One concept: K/V row addressing; the attention math never sees which form it is.
//
//   KV_ADDRESSING 0  contiguous  k (B, S_cache, H_kv, D) any strides; seqlen = seqlens[b] or S_cache
//   KV_ADDRESSING 1  block table k (num_pages, page_size, H_kv, D); page = table[b][j / page_size]
//   KV_ADDRESSING 2  slot table  k (num_slots, H_kv, D); slot = slots[cu_seqlens_k[b] + j] (int64)
#pragma once
#include <stdint.h>

#ifndef KV_ADDRESSING
#define KV_ADDRESSING 0
#endif

namespace hfp {

template <typename Elem>
struct KvAddressT {
  const Elem* k;
  const Elem* v;
  long long k_stride0, k_stride1, k_stride2;  // (batch | page, token | slot-in-page | slot, head) in elements
  long long v_stride0, v_stride1, v_stride2;
  const int* seqlens;          // (B,) valid keys per sequence, or nullptr (contiguous: all S_cache)
  int default_seqlen;          // S_cache (contiguous without seqlens)
  const void* index;           // int32 page table (B, index_stride) | int64 slots (total_k,)
  long long index_stride;      // page table row stride
  int page_size;
  const int* cu_seqlens_k;     // slot form: (B + 1,)

  __device__ __forceinline__ int seqlen(int b) const {
#if KV_ADDRESSING == 2
    return cu_seqlens_k[b + 1] - cu_seqlens_k[b];
#else
    return seqlens != nullptr ? seqlens[b] : default_seqlen;
#endif
  }

#if KV_ADDRESSING == 2
  using Entry = long long;  // a slot
#else
  using Entry = int;  // a page (block table); unused (0) for the contiguous form
#endif

  // The index-table entry that places key j of sequence b: its page (block table) or slot (slot
  // table); contiguous caches have no table (0). Separate from locate_entry so that a caller can
  // issue this dependent global load early (INDEX_AHEAD) and use it later.
  __device__ __forceinline__ Entry entry(int b, int j) const {
#if KV_ADDRESSING == 0
    (void)b, (void)j;
    return 0;
#elif KV_ADDRESSING == 1
    return static_cast<const int*>(index)[(long long)b * index_stride + j / page_size];
#else
    return static_cast<const long long*>(index)[cu_seqlens_k[b] + j];
#endif
  }

  // Offsets (elements) of the first k/v element of (b, key j, kv head h) as (row, head) components,
  // given entry(b, j).
  __device__ __forceinline__ void locate_entry(Entry e, int b, int j, long long& k_off, long long& v_off) const {
#if KV_ADDRESSING == 0
    (void)e;
    k_off = (long long)b * k_stride0 + (long long)j * k_stride1;
    v_off = (long long)b * v_stride0 + (long long)j * v_stride1;
#elif KV_ADDRESSING == 1
    (void)b;
    const int in_page = j % page_size;
    k_off = (long long)e * k_stride0 + (long long)in_page * k_stride1;
    v_off = (long long)e * v_stride0 + (long long)in_page * v_stride1;
#else
    (void)b, (void)j;
    k_off = e * k_stride1;
    v_off = e * v_stride1;
#endif
  }

  __device__ __forceinline__ void locate(int b, int j, long long& k_off, long long& v_off) const {
    locate_entry(entry(b, j), b, j, k_off, v_off);
  }
};

}  // namespace hfp
