// hf_flashpatch: write new tokens' K/V rows into their physical slots of a KV pool
// (pool[slot[t]] = new[t], both K and V in one launch). One concept: the cache write of a paged /
// slot-indexed decode step. Dtype agnostic: rows are moved as 16-byte chunks.
//
// k_new, v_new: (T, H_kv, D) any token/head strides (V: D_v, its own head dim where it has one), last dim
// contiguous, rows 16-byte aligned. k_pool, v_pool: (num_slots, H_kv, D) likewise (V: D_v). slots: int64 (T,); a negative slot skips the token
// (padding), and so does one >= num_slots (no slot content may write outside the pools). A
// block-table pool (num_pages, page_size, H_kv, D) is the same pool with slot = page * page_size + offset.
#include <stdint.h>

extern "C" __global__ void __launch_bounds__(256) hfp_kv_append(
    const uint4* __restrict__ k_new, const uint4* __restrict__ v_new, long long new_k_st, long long new_k_sh,
    long long new_v_st, long long new_v_sh, uint4* __restrict__ k_pool, uint4* __restrict__ v_pool,
    long long pool_k_ss, long long pool_k_sh, long long pool_v_ss, long long pool_v_sh,
    const long long* __restrict__ slots, int num_tokens, int kv_heads, int k_row_chunks, int v_row_chunks,
    long long num_slots) {
  // Strides are in 16-byte chunks. One thread moves chunk c of K and chunk c of V, where their rows have one.
  const int row_chunks = k_row_chunks > v_row_chunks ? k_row_chunks : v_row_chunks;
  const long long total = (long long)num_tokens * kv_heads * row_chunks;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
    const int c = i % row_chunks;
    const int h = (i / row_chunks) % kv_heads;
    const long long t = i / ((long long)row_chunks * kv_heads);
    const long long slot = slots[t];
    if (slot < 0 || slot >= num_slots) continue;
    if (c < k_row_chunks) k_pool[slot * pool_k_ss + h * pool_k_sh + c] = k_new[t * new_k_st + h * new_k_sh + c];
    if (c < v_row_chunks) v_pool[slot * pool_v_ss + h * pool_v_sh + c] = v_new[t * new_v_st + h * new_v_sh + c];
  }
}
