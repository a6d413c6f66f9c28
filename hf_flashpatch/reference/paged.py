"""Paged-KV decode reference: gather K/V through the page table, then run the naive oracle.

Two index forms, both describing where each logical token of each sequence lives in a shared pool:

- **block table**: pools ``k_pages (num_pages, page_size, H_kv, D)`` and ``v_pages`` (the same with v's
  ``D_v``, which may differ from ``D``), ``page_table``
  int ``(B, max_pages)`` (entry ``p`` of row ``b`` is the physical page holding tokens
  ``p*page_size ... (p+1)*page_size - 1`` of sequence ``b``), ``seqlens_k`` int ``(B,)``;
- **slot table**: pools ``k_pool (num_slots, H_kv, D)``, ``v_pool (num_slots, H_kv, D_v)``, ``slots`` int
  ``(total_k,)`` with
  the physical slot of every logical token, sequences delimited by ``cu_seqlens_k (B + 1,)``. This
  is what transformers' continuous batching passes as ``read_index``; it is a block table with
  ``page_size = 1``.

q is ``(B, S_q, H, D)``: the last ``S_q`` tokens of each sequence (bottom-right causal when
``causal=True``). Returns ``out (B, S_q, H, D_v)`` and ``lse (B, H, S_q)``.
"""

from __future__ import annotations

import torch

from .naive import attention_reference


def gather_pages(pages: torch.Tensor, page_table_row: torch.Tensor, seqlen: int) -> torch.Tensor:
    """Un-page one sequence: ``(num_pages, page_size, H_kv, D)`` -> ``(seqlen, H_kv, D)`` (any last dim)."""
    page_size = pages.shape[1]
    num_used = (seqlen + page_size - 1) // page_size
    used = pages[page_table_row[:num_used].long()]  # (num_used, page_size, H_kv, D)
    return used.reshape(-1, *pages.shape[2:])[:seqlen]  # (seqlen, H_kv, D)


def paged_decode_reference(q, k_pages, v_pages, page_table, seqlens_k, **kwargs):
    """Block-table form; kwargs as for ``attention_reference`` (causal, softmax_scale, window, softcap)."""
    outs, lses = [], []
    for b, seqlen in enumerate(seqlens_k.tolist()):
        k = gather_pages(k_pages, page_table[b], seqlen)[None]  # (1, S_k, H_kv, D)
        v = gather_pages(v_pages, page_table[b], seqlen)[None]
        o, l = attention_reference(q[b : b + 1], k, v, **kwargs)
        outs.append(o)
        lses.append(l)
    return torch.cat(outs), torch.cat(lses)


def slot_decode_reference(q, k_pool, v_pool, slots, cu_seqlens_k, **kwargs):
    """Slot-table form (page size 1, sequences delimited by ``cu_seqlens_k``)."""
    outs, lses = [], []
    bounds = cu_seqlens_k.tolist()
    for b in range(len(bounds) - 1):
        idx = slots[bounds[b] : bounds[b + 1]].long()
        o, l = attention_reference(q[b : b + 1], k_pool[idx][None], v_pool[idx][None], **kwargs)
        outs.append(o)
        lses.append(l)
    return torch.cat(outs), torch.cat(lses)
