"""The torch path taken where the CUDA kernels cannot serve a call (CPU, fp32, old GPUs, no pycuda).

Same layouts and semantics as the public API (see :mod:`hf_flashpatch.api`), v's head dim ``D_v``
included (it may differ from q/k's ``D``: out has ``D_v``, the default scale is ``1 / sqrt(D)``). It uses torch's
``scaled_dot_product_attention`` where that computes the same function (no softcap, no LSE
requested) and the tiled online-softmax reference otherwise; rows that see no key give 0.

NaN: a NaN in q or k makes exactly the rows that see it NaN, on both paths. sdpa alone does not:
its CPU kernels drop a NaN query row, and a mask tensor is added to the scores, so a NaN key reaches
the rows the mask hides it from (``NaN + -inf`` is NaN). So sdpa gets q and k with NaN replaced by
0, and the rows that see a NaN are set to NaN afterwards (:func:`_nan_rows`; no host sync). Where a mask
applies, an infinite value in q or k, or finite ones whose scores may pass fp32's range (their scores are inf or
NaN by plain arithmetic, as in the kernels), takes the tiled path, which masks each score before the softmax reads
it (sdpa adds the mask to an inf score); that check costs one host sync on CUDA, as the mask's own row check does.
Without a mask both paths compute the same.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .reference import attention_tiled, gather_pages, normalize_window, visibility_mask


def attention(q, k, v, *, causal, softmax_scale, window, softcap, return_lse):
    """q ``(B, S_q, H, D)``, k ``(B, S_k, H_kv, D)``, v ``(B, S_k, H_kv, D_v)`` -> out ``(B, S_q, H, D_v)``
    [, lse ``(B, H, S_q)``]."""
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    left, right = normalize_window(window, causal)
    masked = left >= 0 or right >= 0
    if softcap or return_lse or (masked and _scores_may_be_infinite(q, k, scale)):
        out, lse = attention_tiled(
            q, k, v, causal=causal, softmax_scale=scale, window=window, softcap=softcap, block_m=128, block_n=256
        )
        out, lse = _in_graph(out, q, k, v), _in_graph(lse, q, k, v)
        return (out, lse) if return_lse else out
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    mask = None
    if masked:
        mask = visibility_mask(seqlen_q, seqlen_k, left, right, device=q.device)  # (S_q, S_k)
    q_nan, k_nan = q.isnan().any(dim=-1), k.isnan().any(dim=-1)  # (B, S_q, H), (B, S_k, H_kv)
    out = F.scaled_dot_product_attention(
        q.masked_fill(q_nan[..., None], 0.0).transpose(1, 2),  # (B, H, S_q, D)
        k.masked_fill(k_nan[..., None], 0.0).transpose(1, 2),  # (B, H_kv, S_k, D)
        v.transpose(1, 2),  # (B, H_kv, S_k, D_v): sdpa takes a value head dim of its own
        attn_mask=mask,
        scale=scale,
        enable_gqa=k.shape[2] != q.shape[2],
    ).transpose(1, 2)  # (B, S_q, H, D_v)
    if mask is not None and not bool(mask.any(dim=-1).all()):
        out = out.masked_fill(~mask.any(dim=-1)[None, :, None, None], 0.0)  # rows with no key: 0, not NaN
    return out.masked_fill(_nan_rows(q_nan, k_nan, mask)[..., None], float("nan"))


def _scores_may_be_infinite(q: torch.Tensor, k: torch.Tensor, scale: float) -> bool:
    """Whether a score ``scale * q . k`` may be infinite: an infinite q or k, or finite ones whose dot product may
    pass fp32's range (bounded by ``D * max|q| * max|k| * |scale|``). One host sync on CUDA."""
    if q.numel() == 0 or k.numel() == 0:
        return False
    infinite = q.isinf().any() | k.isinf().any()
    bound = q.abs().amax().double() * k.abs().amax().double() * (abs(scale) * q.shape[-1])  # NaN if any is NaN
    return bool(infinite | (bound > torch.finfo(torch.float32).max))


def _in_graph(result, *inputs):
    """``result`` unchanged, but part of the autograd graph of the ``inputs`` that require a gradient (zero
    gradients). The tiled reference leaves a result outside it when no tile is visited (no keys at all), where
    sdpa's zeros stay connected. ``torch.where`` never reads the input's values, so a NaN there stays out."""
    if result.requires_grad or not torch.is_grad_enabled():
        return result
    for t in inputs:
        if t.requires_grad and t.numel() > 0:
            never = torch.zeros((), dtype=torch.bool, device=t.device)
            result = result + torch.where(never, t.reshape(-1)[0], 0.0).to(result.dtype)
    return result


def _nan_rows(q_nan, k_nan, mask):
    """Bool ``(B, S_q, H)``: rows that see a key (``mask (S_q, S_k)``, None = all) and have a NaN query
    (``q_nan (B, S_q, H)``) or see a NaN key (``k_nan (B, S_k, H_kv)``), as the reference computes."""
    group = q_nan.shape[2] // k_nan.shape[2]
    if mask is None:
        sees_nan = k_nan.any(dim=1, keepdim=True)  # (B, 1, H_kv)
        has_key = k_nan.shape[1] > 0
    else:
        sees_nan = torch.matmul(mask.to(torch.float32), k_nan.to(torch.float32)) > 0  # (B, S_q, H_kv)
        has_key = mask.any(dim=-1)[None, :, None]  # (1, S_q, 1)
    return (q_nan | sees_nan.repeat_interleave(group, dim=2)) & has_key


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, *, return_lse, **kwargs):
    """q ``(T_q, H, D)``, k ``(T_k, H_kv, D)``, v ``(T_k, H_kv, D_v)`` -> out ``(T_q, H, D_v)`` [, lse ``(H, T_q)``].

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
        outs.append(res[0][0])  # (len_q, H, D_v)
        if return_lse:
            lses.append(res[1][0])  # (H, len_q)
    tail = q.shape[0] - cq[-1]
    outs.append(q.new_zeros(tail, q.shape[1], v.shape[-1]))  # (tail, H, D_v)
    out = torch.cat(outs)
    if not return_lse:
        return out
    lses.append(torch.full((q.shape[1], tail), float("-inf"), device=q.device))
    return out, torch.cat(lses, dim=1)


def empty_batch(q, return_lse, head_dim_v=None):
    """The result of a batched call with no rows: out ``(0, S_q, H, D_v)`` [, lse ``(0, H, S_q)``];
    ``head_dim_v`` None: q's head dim."""
    out = q.new_zeros(*q.shape[:-1], q.shape[-1] if head_dim_v is None else head_dim_v)
    lse = torch.zeros(0, q.shape[2], q.shape[1], dtype=torch.float32, device=q.device)
    return (out, lse) if return_lse else out


def kvcache_attention(q, k_cache, v_cache, cache_seqlens, *, return_lse, **kwargs):
    """Per-row valid lengths: q ``(B, S_q, H, D)``, caches ``(B, S_cache, H_kv, D)`` and ``(.., D_v)``,
    seqlens ``(B,)`` (each in ``[0, S_cache]``: the API checks it, since a negative slice end would count
    from the end)."""
    if q.shape[0] == 0:
        return empty_batch(q, return_lse, v_cache.shape[-1])
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
    if q.shape[0] == 0:
        return empty_batch(q, return_lse, v_pages.shape[-1])
    outs, lses = [], []
    for b, length in enumerate(seqlens_k.tolist()):
        k = gather_pages(k_pages, page_table[b], length)[None]  # (1, S_k, H_kv, D)
        v = gather_pages(v_pages, page_table[b], length)[None]  # (1, S_k, H_kv, D_v)
        res = attention(q[b : b + 1], k, v, return_lse=return_lse, **kwargs)
        outs.append(res[0] if return_lse else res)
        if return_lse:
            lses.append(res[1])
    out = torch.cat(outs)
    return (out, torch.cat(lses)) if return_lse else out
