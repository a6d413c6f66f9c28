"""Public attention functions. Layout: (batch, seqlen, heads, head_dim), flash-attn's convention.

Every function validates its inputs (errors name what was received), then runs the CUDA kernel when
it can and the torch fallback (:mod:`hf_flashpatch.fallback`) otherwise. A CUDA tensor that the
kernels cannot serve (no pycuda/nvcc, fp32, compute capability < 8.0, an unsupported head dim)
takes the fallback with one warning per reason.

Common keyword arguments:

- ``causal``: bottom-right aligned when ``seqlen_q < seqlen_k`` (queries are the last tokens);
- ``softmax_scale``: default ``1 / sqrt(head_dim)``;
- ``window``: ``(left, right)`` keys visible on each side of the diagonal, ``None``/``-1`` unbounded
  (transformers' ``sliding_window=W`` is ``(W - 1, 0)`` with causal);
- ``softcap``: ``scores = softcap * tanh(scores / softcap)`` after scaling (Gemma 2);
- ``return_lse``: also return the fp32 log-sum-exp of each query row, ``-inf`` where no key is seen.

K/V may have fewer heads than Q (GQA/MQA): query head ``h`` reads KV head ``h // (H // H_kv)``.
Rows that see no key return zeros.
"""

from __future__ import annotations

import warnings

import torch

from . import fallback
from .errors import KernelUnsupported
from .kernels import kernels_unavailable_reason
from .reference.masks import normalize_window
from .validate import check_cu_seqlens, check_qkv, check_softcap_window

_warned: set[str] = set()


def _warn_once(reason: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"hf_flashpatch: CUDA kernel not used ({reason}); taking the torch fallback", stacklevel=3)


def _kernel_call(q: torch.Tensor, run):
    """Run ``run()`` (a kernel call) if the kernels can serve ``q``; None means take the fallback."""
    reason = kernels_unavailable_reason(q)
    if reason is not None:
        if q.is_cuda:
            _warn_once(reason)
        return None
    try:
        return run()
    except KernelUnsupported as exc:
        _warn_once(str(exc))
        return None


def _window_args(window, causal):
    left, right = normalize_window(window, causal)
    return dict(causal=causal, window_left=left, window_right=right)


def flash_attn_func(
    q, k, v, *, causal=False, softmax_scale=None, window=None, softcap=None, return_lse=False, deterministic=False
):
    """Attention over a batch of equal-length sequences.

    q ``(B, S_q, H, D)``, k/v ``(B, S_k, H_kv, D)``; fp16/bf16 (fp32 takes the fallback); strided
    views are fine as long as the last dim is contiguous. Returns ``out (B, S_q, H, D)`` in q's dtype
    and, with ``return_lse``, ``lse (B, H, S_q)`` fp32. Differentiable (``deterministic=True`` makes
    the backward bit-reproducible).
    """
    check_qkv(q, k, v, packed=False)
    check_softcap_window(softcap, window)
    common = dict(softmax_scale=softmax_scale, softcap=softcap or None)

    def run():
        from .kernels import forward

        if not torch.is_grad_enabled() or not (q.requires_grad or k.requires_grad or v.requires_grad):
            decoded = _try_decode(q, k, v, None, causal, window, common)
            if decoded is not None:
                return decoded
        return forward.attention_forward(q, k, v, deterministic=deterministic, **_window_args(window, causal), **common)

    res = _kernel_call(q, run)
    if res is None:
        return fallback.attention(q, k, v, causal=causal, window=window, return_lse=return_lse, **common)
    return res if return_lse else res[0]


def _try_decode(q, k, v, cache_seqlens, causal, window, common):
    """The split-KV decode kernel serves few-query calls over long caches; None if it declines."""
    from .kernels import decode

    try:
        return decode.decode_forward(q, k, v, cache_seqlens, **_window_args(window, causal), **common)
    except KernelUnsupported:
        return None


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    *,
    causal=False,
    softmax_scale=None,
    window=None,
    softcap=None,
    return_lse=False,
    deterministic=False,
):
    """Packed sequences (no padding): q ``(T_q, H, D)``, k/v ``(T_k, H_kv, D)``; sequence ``i`` is
    rows ``cu_seqlens[i]:cu_seqlens[i+1]`` (int32, ``(num_seqs + 1,)``). ``max_seqlen_*`` are ints.
    Returns ``out (T_q, H, D)`` and, with ``return_lse``, ``lse (H, T_q)`` fp32."""
    check_qkv(q, k, v, packed=True)
    check_softcap_window(softcap, window)
    check_cu_seqlens(cu_seqlens_q, q.shape[0], "cu_seqlens_q", q.device)
    check_cu_seqlens(cu_seqlens_k, k.shape[0], "cu_seqlens_k", q.device)
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(
            f"cu_seqlens_q and cu_seqlens_k must describe the same number of sequences, got "
            f"{cu_seqlens_q.numel() - 1} and {cu_seqlens_k.numel() - 1}"
        )
    common = dict(softmax_scale=softmax_scale, softcap=softcap or None)

    def run():
        from .kernels import forward

        return forward.attention_forward(
            q, k, v,
            cu_seqlens_q=cu_seqlens_q.int(), cu_seqlens_k=cu_seqlens_k.int(),
            max_seqlen_q=int(max_seqlen_q), max_seqlen_k=int(max_seqlen_k),
            deterministic=deterministic, **_window_args(window, causal), **common,
        )  # fmt: skip

    res = _kernel_call(q, run)
    if res is None:
        return fallback.varlen_attention(
            q, k, v, cu_seqlens_q, cu_seqlens_k, causal=causal, window=window, return_lse=return_lse, **common
        )
    return res if return_lse else res[0]


def flash_attn_with_kvcache(
    q, k_cache, v_cache, cache_seqlens=None, *, causal=True, softmax_scale=None, window=None, softcap=None,
    return_lse=False,
):  # fmt: skip
    """Decode over a contiguous cache (inference only).

    q ``(B, S_q, H, D)`` (the newest ``S_q`` tokens, usually 1), k_cache/v_cache
    ``(B, S_cache, H_kv, D)`` (strided views such as a transposed transformers cache are fine),
    ``cache_seqlens`` int32 ``(B,)`` valid tokens per row (None: all ``S_cache``). Runs the split-KV
    decode kernel. Returns ``out (B, S_q, H, D)`` [, ``lse (B, H, S_q)``].
    """
    check_qkv(q, k_cache, v_cache, packed=False)
    check_softcap_window(softcap, window)
    if cache_seqlens is not None:
        if cache_seqlens.shape != (q.shape[0],):
            raise ValueError(f"cache_seqlens must be ({q.shape[0]},), got {tuple(cache_seqlens.shape)}")
        cache_seqlens = cache_seqlens.to(device=q.device, dtype=torch.int32)
    common = dict(softmax_scale=softmax_scale, softcap=softcap or None)

    def run():
        from .kernels import decode

        return decode.decode_forward(q, k_cache, v_cache, cache_seqlens, **_window_args(window, causal), **common)

    res = _kernel_call(q, run)
    if res is None:
        return fallback.kvcache_attention(
            q, k_cache, v_cache, cache_seqlens, causal=causal, window=window, return_lse=return_lse, **common
        )
    return res if return_lse else res[0]


def flash_attn_paged_decode(
    q, k_pages, v_pages, page_table, seqlens_k, *, causal=True, softmax_scale=None, window=None, softcap=None,
    return_lse=False,
):  # fmt: skip
    """Decode over a paged KV pool (block-table form).

    q ``(B, S_q, H, D)``; pools ``(num_pages, page_size, H_kv, D)``; ``page_table`` int32
    ``(B, max_pages)``; ``seqlens_k`` int32 ``(B,)``. Page size may be any positive int (1 makes it
    a per-token slot table). Returns ``out (B, S_q, H, D)`` [, ``lse (B, H, S_q)``]. For a managed
    pool (allocation, appends, freeing) see :class:`hf_flashpatch.paged.PagedKVCache`.
    """
    if k_pages.dim() != 4 or k_pages.shape != v_pages.shape:
        raise ValueError(
            f"k_pages/v_pages must be (num_pages, page_size, H_kv, D) and equal, got "
            f"{tuple(k_pages.shape)} and {tuple(v_pages.shape)}"
        )
    one_page = (q.shape[0], -1, -1, -1)  # page 0 viewed as (B, page_size, H_kv, D) for the shared checks
    check_qkv(q, k_pages[None, 0].expand(one_page), v_pages[None, 0].expand(one_page), packed=False)
    check_softcap_window(softcap, window)
    batch = q.shape[0]
    if page_table.dim() != 2 or page_table.shape[0] != batch:
        raise ValueError(f"page_table must be ({batch}, max_pages), got {tuple(page_table.shape)}")
    if seqlens_k.shape != (batch,):
        raise ValueError(f"seqlens_k must be ({batch},), got {tuple(seqlens_k.shape)}")
    common = dict(softmax_scale=softmax_scale, softcap=softcap or None)

    def run():
        from .kernels import decode

        return decode.paged_decode_forward(
            q, k_pages, v_pages, page_table.int(), seqlens_k.int(), **_window_args(window, causal), **common
        )

    res = _kernel_call(q, run)
    if res is None:
        return fallback.paged_attention(
            q, k_pages, v_pages, page_table, seqlens_k, causal=causal, window=window, return_lse=return_lse, **common
        )
    return res if return_lse else res[0]
