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

  // Offsets (elements) of the first k/v element of (b, key j, kv head h) as (row, head) components.
  __device__ __forceinline__ void locate(int b, int j, long long& k_off, long long& v_off) const {
#if KV_ADDRESSING == 0
    k_off = (long long)b * k_stride0 + (long long)j * k_stride1;
    v_off = (long long)b * v_stride0 + (long long)j * v_stride1;
#elif KV_ADDRESSING == 1
    const int page = static_cast<const int*>(index)[(long long)b * index_stride + j / page_size];
    const int in_page = j % page_size;
    k_off = (long long)page * k_stride0 + (long long)in_page * k_stride1;
    v_off = (long long)page * v_stride0 + (long long)in_page * v_stride1;
#else
    const long long slot = static_cast<const long long*>(index)[cu_seqlens_k[b] + j];
    k_off = slot * k_stride1;
    v_off = slot * v_stride1;
#endif
  }
};

}  // namespace hfp
