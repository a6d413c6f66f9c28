"""The torch path taken where the CUDA kernels cannot serve a call (CPU, fp32, old GPUs, no pycuda).

Same layouts and semantics as the public API (see :mod:`hf_flashpatch.api`). It uses torch's
``scaled_dot_product_attention`` where that computes exactly the same function (no softcap, no LSE
requested) and the tiled online-softmax reference otherwise; rows that see no key give 0.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .reference import attention_tiled, gather_pages, normalize_window, visibility_mask


def attention(q, k, v, *, causal, softmax_scale, window, softcap, return_lse):
    """q ``(B, S_q, H, D)``, k/v ``(B, S_k, H_kv, D)`` -> out ``(B, S_q, H, D)`` [, lse ``(B, H, S_q)``]."""
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    if softcap or return_lse:
        out, lse = attention_tiled(
            q, k, v, causal=causal, softmax_scale=scale, window=window, softcap=softcap, block_m=128, block_n=256
        )
        return (out, lse) if return_lse else out
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    left, right = normalize_window(window, causal)
    mask = None
    if left >= 0 or right >= 0:
        mask = visibility_mask(seqlen_q, seqlen_k, left, right, device=q.device)  # (S_q, S_k)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2),  # (B, H, S_q, D)
        k.transpose(1, 2),  # (B, H_kv, S_k, D)
        v.transpose(1, 2),
        attn_mask=mask,
        scale=scale,
        enable_gqa=k.shape[2] != q.shape[2],
    ).transpose(1, 2)  # (B, S_q, H, D)
    if mask is not None and not bool(mask.any(dim=-1).all()):
        out = out.masked_fill(~mask.any(dim=-1)[None, :, None, None], 0.0)  # rows with no key: 0, not NaN
    return out


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, *, return_lse, **kwargs):
    """q ``(T_q, H, D)``, k/v ``(T_k, H_kv, D)`` -> out ``(T_q, H, D)`` [, lse ``(H, T_q)``].

    Built with ``torch.cat`` (no in-place writes) so autograd flows through; tokens past
    ``cu_seqlens_q[-1]`` get 0 and lse ``-inf``.
    """
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    outs, lses = [], []
    for i in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[i], cq[i + 1], ck[i], ck[i + 1]
        if q1 == q0:
            continue
        res = attention(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], return_lse=True, **kwargs) if return_lse \
            else (attention(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], return_lse=False, **kwargs), None)
        outs.append(res[0][0])  # (len_q, H, D)
        if return_lse:
            lses.append(res[1][0])  # (H, len_q)
    tail = q.shape[0] - cq[-1]
    outs.append(q.new_zeros(tail, *q.shape[1:]))
    out = torch.cat(outs)
    if not return_lse:
        return out
    lses.append(torch.full((q.shape[1], tail), float("-inf"), device=q.device))
    return out, torch.cat(lses, dim=1)


def kvcache_attention(q, k_cache, v_cache, cache_seqlens, *, return_lse, **kwargs):
    """Per-row valid lengths: q ``(B, S_q, H, D)``, caches ``(B, S_cache, H_kv, D)``, seqlens ``(B,)``."""
    if cache_seqlens is None:
        return attention(q, k_cache, v_cache, return_lse=return_lse, **kwargs)
    outs, lses = [], []
    for b, length in enumerate(cache_seqlens.tolist()):
        res = attention(q[b : b + 1], k_cache[b : b + 1, :length], v_cache[b : b + 1, :length], return_lse=return_lse, **kwargs)
        outs.append(res[0] if return_lse else res)
        if return_lse:
            lses.append(res[1])
    out = torch.cat(outs)
    return (out, torch.cat(lses)) if return_lse else out


def paged_attention(q, k_pages, v_pages, page_table, seqlens_k, *, return_lse, **kwargs):
    """Block-table form (see :mod:`hf_flashpatch.reference.paged`)."""
    outs, lses = [], []
    for b, length in enumerate(seqlens_k.tolist()):
        k = gather_pages(k_pages, page_table[b], length)[None]  # (1, S_k, H_kv, D)
        v = gather_pages(v_pages, page_table[b], length)[None]
        res = attention(q[b : b + 1], k, v, return_lse=return_lse, **kwargs)
        outs.append(res[0] if return_lse else res)
        if return_lse:
            lses.append(res[1])
    out = torch.cat(outs)
    return (out, torch.cat(lses)) if return_lse else out
