"""Public attention functions. Layout: (batch, seqlen, heads, head_dim), flash-attn's convention.

Every function validates its inputs (errors name what was received), then runs the CUDA kernel when
it can and the torch fallback (:mod:`hf_flashpatch.fallback`) otherwise. A CUDA tensor that the
kernels cannot serve (no pycuda/nvcc, fp32, compute capability < 8.0, an unsupported head dim)
takes the fallback with one warning per reason.

v may have a head dim of its own, ``head_dim_v`` (``D_v``; multi-head latent attention: DeepSeek-V3's
q/k 192, v 128): out then has ``D_v`` columns, lse is unchanged and ``softmax_scale=None`` is
``1 / sqrt(D)``, D being q/k's. Every function serves it on the kernels
(:mod:`hf_flashpatch.kernels.value_head_dim`): the decode kernels read v's rows at ``D_v`` (192/128 is built;
other pairs take the fallback with one warning), the forward and backward kernels take 192/128 themselves on
Hopper (the backward not with softcap or ``deterministic=True``), and the rest (other pairs, other GPUs) runs on
exactly zero-padded inputs at ``P / D`` and ``P / D_v`` times the work of the pair (a padded 192/128 backward pads
v to 192; the forward off Hopper pads both to 256).

Common keyword arguments:

- ``causal``: bottom-right aligned when ``seqlen_q < seqlen_k`` (queries are the last tokens);
- ``softmax_scale``: a finite float; ``None`` (only ``None``) means ``1 / sqrt(head_dim)``, so
  ``0.0`` is a scale of 0 on every path;
- ``window``: ``(left, right)`` ints, keys visible on each side of the diagonal, ``None``/``-1``
  unbounded, other negatives an error (transformers' ``sliding_window=W`` is ``(W - 1, 0)`` with causal);
- ``softcap``: ``scores = softcap * tanh(scores / softcap)`` after scaling (Gemma 2); ``None``, 0
  and ``inf`` mean no cap, NaN or a negative value is an error;
- ``return_lse``: also return the fp32 log-sum-exp of each query row, ``-inf`` where no key is seen;
- ``sinks``: ``(H,)`` floating, one learned logit per query head that joins every row's softmax
  denominator without a value (GPT-OSS); the returned lse includes it. See :mod:`hf_flashpatch.sinks`;
- ``check_inputs`` (functions that take index tables): see "Table contents" below.

K/V may have fewer heads than Q (GQA/MQA): query head ``h`` reads KV head ``h // (H // H_kv)``.
Rows that see no key return zeros. A NaN in q or k gives NaN in the rows that see it (out and lse),
as in torch, and never reaches other rows or sequences; an infinite one gives its scores' plain arithmetic,
masked first. A NaN or inf in v is not masked (a masked key's weight 0 times inf is NaN): keep v finite.

Table contents (``cu_seqlens_*`` and ``max_seqlen_*``, ``cache_seqlens``, ``page_table`` and
``seqlens_k``): ``cu_seqlens`` start at 0, never decrease and end within the rows of q/k (rows past
the end are padding: zeros out, ``-inf`` lse, where the tables were checked; unchecked, the kernels leave
them unwritten, as flash-attn does); lengths lie in ``[0, capacity]``; every page a
sequence reads lies in ``[0, num_pages)``. Tables on the CPU are always checked. CUDA tables are
checked in eager mode by one combined check per call that costs one device-to-host sync; pass
``check_inputs=False`` to skip it when the caller built the tables itself (a decode loop). They are
never checked while ``torch.compile`` traces or a CUDA graph is captured. Unchecked, an invalid table
gives wrong numbers but never an out-of-bounds access: the kernels clamp every table read (page ids
and lengths) to the tensors passed.
"""

from __future__ import annotations

import warnings

import torch

from . import fallback
from .errors import KernelUnsupported
from .kernels import kernels_unavailable_reason
from .reference.masks import normalize_window
from .sinks import add_sinks
from .validate import check_flags, check_kvcache, check_paged, check_qkv, check_scalars, check_sinks, check_varlen

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


def _finish(res, fall_back, return_lse: bool, sinks, padding_from=None, checked_end: int | None = None):
    """The kernel's ``(out, lse)``, else ``fall_back(want_lse)``'s; sinks folded in (:mod:`.sinks`); out contiguous
    on every path. ``padding_from`` (packed calls: ``cu_seqlens_q[-1]``, a tensor): the rows from there on belong to
    no sequence and keep lse ``-inf`` with sinks too. ``checked_end``: the same row as a host int, where the
    table check read it: those rows become 0 and ``-inf`` on every path (the kernels do not write them)."""
    if res is None:
        res = fall_back(return_lse or sinks is not None)
    if checked_end is not None:
        res = _clear_padding_rows(res, checked_end)
    if sinks is not None:
        out, lse = add_sinks(*res, sinks)  # out (T_q, H, D_v), lse (H, T_q) when packed
        if padding_from is not None:
            rows = torch.arange(lse.shape[-1], device=lse.device)  # (T_q,)
            lse = lse.masked_fill(rows >= padding_from.to(lse.device), float("-inf"))
        res = (out, lse)
    if not isinstance(res, tuple):
        return res.contiguous()
    out = res[0].contiguous()
    return (out, res[1]) if return_lse else out


def _clear_padding_rows(res, end: int):
    """Packed ``out (T_q, H, D_v)`` [, ``lse (H, T_q)``] with rows ``end:`` (no sequence's) 0 and ``-inf``. Out of
    place: ``out`` may be an autograd output its backward reads; rows past the end get no gradient."""
    out, lse = res if isinstance(res, tuple) else (res, None)
    tail = out.shape[0] - end
    if tail <= 0:
        return res
    out = torch.cat((out[:end], out.new_zeros((tail, *out.shape[1:]))))  # (T_q, H, D_v)
    if lse is None:
        return out
    return out, torch.cat((lse[:, :end], lse.new_full((lse.shape[0], tail), float("-inf"))), dim=1)  # (H, T_q)


def _shapes_only(q, head_dim_v: int, return_lse: bool):
    """The result on the meta device (no values, as torch's own ops give there): out ``(..., H, D_v)`` and lse
    ``(B, H, S_q)``, or ``(H, T_q)`` for packed q ``(T_q, H, D)``."""
    out = q.new_empty((*q.shape[:-1], head_dim_v))
    if not return_lse:
        return out
    lse_shape = (q.shape[1], q.shape[0]) if q.dim() == 3 else (q.shape[0], q.shape[2], q.shape[1])
    return out, q.new_empty(lse_shape, dtype=torch.float32)


def _window_args(window, causal):
    left, right = normalize_window(window, causal)
    return dict(causal=causal, window_left=left, window_right=right)


def flash_attn_func(
    q, k, v, *, causal=False, softmax_scale=None, window=None, softcap=None, return_lse=False, deterministic=False,
    sinks=None,
):
    """Attention over a batch of equal-length sequences.

    q ``(B, S_q, H, D)``, k ``(B, S_k, H_kv, D)``, v ``(B, S_k, H_kv, D_v)`` (``D_v`` may differ from
    ``D``: module docstring); fp16/bf16 (fp32 takes the fallback); strided views are fine as long as the
    last dim is contiguous. Returns ``out (B, S_q, H, D_v)`` in q's dtype and, with ``return_lse``,
    ``lse (B, H, S_q)`` fp32. Differentiable (``deterministic=True`` makes the backward bit-reproducible).
    """
    check_qkv(q, k, v, packed=False)
    softcap = check_scalars(softmax_scale, softcap, window, causal)
    check_flags(return_lse=return_lse, deterministic=deterministic)
    sinks = check_sinks(sinks, q)
    if q.device.type == "meta":
        return _shapes_only(q, v.shape[-1], return_lse)
    common = dict(softmax_scale=softmax_scale, softcap=softcap or None)

    def run():
        from .kernels import forward

        if not _needs_grad(q, k, v) and q.shape[0] > 0:  # the decode launch sizes its split by rows per sequence
            decoded = _try_decode(q, k, v, None, causal, window, common)
            if decoded is not None:
                return decoded
        return forward.attention_forward(q, k, v, deterministic=deterministic, **_window_args(window, causal), **common)

    res = _kernel_call(q, run)
    fall_back = lambda lse: fallback.attention(  # noqa: E731
        q, k, v, causal=causal, window=window, return_lse=lse, **common
    )
    return _finish(res, fall_back, return_lse, sinks)


def _needs_grad(q, k, v) -> bool:
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)


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
    check_inputs=True,
    sinks=None,
):
    """Packed sequences (no padding): q ``(T_q, H, D)``, k ``(T_k, H_kv, D)``, v ``(T_k, H_kv, D_v)``; sequence
    ``i`` is rows ``cu_seqlens[i]:cu_seqlens[i+1]`` (int32, ``(num_seqs + 1,)``); rows past ``cu_seqlens[-1]``
    are padding (0 out, ``-inf`` lse where the tables were checked). ``max_seqlen_*`` are ints, at least the
    longest sequence. Returns ``out (T_q, H, D_v)`` and, with ``return_lse``, ``lse (H, T_q)`` fp32.
    ``check_inputs=False`` skips the check of the tables' contents on CUDA (see the module docstring)."""
    check_qkv(q, k, v, packed=True)
    softcap = check_scalars(softmax_scale, softcap, window, causal)
    check_flags(return_lse=return_lse, deterministic=deterministic, check_inputs=check_inputs)
    checked_end = check_varlen(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, check_inputs)
    sinks = check_sinks(sinks, q)
    if q.device.type == "meta":
        return _shapes_only(q, v.shape[-1], return_lse)
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
    fall_back = lambda lse: fallback.varlen_attention(  # noqa: E731
        q, k, v, cu_seqlens_q, cu_seqlens_k, causal=causal, window=window, return_lse=lse, **common
    )
    padding_from = cu_seqlens_q[-1] if sinks is not None else None  # only sinks give padding rows an lse
    return _finish(res, fall_back, return_lse, sinks, padding_from=padding_from, checked_end=checked_end)


def flash_attn_with_kvcache(
    q, k_cache, v_cache, cache_seqlens=None, *, causal=True, softmax_scale=None, window=None, softcap=None,
    return_lse=False, check_inputs=True, sinks=None,
):  # fmt: skip
    """Decode over a contiguous cache (inference only).

    q ``(B, S_q, H, D)`` (the newest ``S_q`` tokens, usually 1), k_cache ``(B, S_cache, H_kv, D)`` and v_cache
    ``(B, S_cache, H_kv, D_v)`` (strided views such as a transposed transformers cache are fine),
    ``cache_seqlens`` int32 ``(B,)`` valid tokens per row, each in ``[0, S_cache]`` (None: all
    ``S_cache``). Runs the split-KV decode kernel; a v_cache with a head dim of its own (``D_v != D``)
    takes the torch fallback instead (module docstring). Returns ``out (B, S_q, H, D_v)`` [, ``lse (B, H, S_q)``].
    ``check_inputs=False`` skips the check of ``cache_seqlens``' values on CUDA (module docstring).
    """
    check_qkv(q, k_cache, v_cache, packed=False, names=("q", "k_cache", "v_cache"))
    softcap = check_scalars(softmax_scale, softcap, window, causal)
    check_flags(return_lse=return_lse, check_inputs=check_inputs)
    check_kvcache(q, k_cache, cache_seqlens, check_inputs)
    sinks = check_sinks(sinks, q)
    if q.device.type == "meta":
        return _shapes_only(q, v_cache.shape[-1], return_lse)
    if q.shape[0] == 0:
        return fallback.empty_batch(q, return_lse, v_cache.shape[-1])
    if cache_seqlens is not None:
        cache_seqlens = cache_seqlens.to(device=q.device, dtype=torch.int32)
    common = dict(softmax_scale=softmax_scale, softcap=softcap or None)

    def run():
        from .kernels import decode
        return decode.decode_forward(q, k_cache, v_cache, cache_seqlens, **_window_args(window, causal), **common)

    res = _kernel_call(q, run)
    fall_back = lambda lse: fallback.kvcache_attention(  # noqa: E731
        q, k_cache, v_cache, cache_seqlens, causal=causal, window=window, return_lse=lse, **common
    )
    return _finish(res, fall_back, return_lse, sinks)


def flash_attn_paged_decode(
    q, k_pages, v_pages, page_table, seqlens_k, *, causal=True, softmax_scale=None, window=None, softcap=None,
    return_lse=False, check_inputs=True, sinks=None,
):  # fmt: skip
    """Decode over a paged KV pool (block-table form).

    q ``(B, S_q, H, D)``; pools ``(num_pages, page_size, H_kv, D)`` (v_pages: ``D_v``, which on CUDA takes
    the torch fallback where it differs from ``D``: module docstring); ``page_table`` int32
    ``(B, max_pages)``; ``seqlens_k`` int32 ``(B,)``. Page size may be any positive int (1 makes it
    a per-token slot table). Row ``b`` reads pages ``page_table[b, :ceil(seqlens_k[b] / page_size)]``,
    each in ``[0, num_pages)``; ``seqlens_k[b]`` lies in ``[0, max_pages * page_size]``.
    ``check_inputs=False`` skips the check of those values on CUDA (module docstring). Returns
    ``out (B, S_q, H, D_v)`` [, ``lse (B, H, S_q)``]. For a managed pool (allocation, appends, freeing)
    see :class:`hf_flashpatch.paged.PagedKVCache`.
    """
    check_flags(return_lse=return_lse, check_inputs=check_inputs)
    check_paged(q, k_pages, v_pages, page_table, seqlens_k, check_inputs)
    softcap = check_scalars(softmax_scale, softcap, window, causal)
    sinks = check_sinks(sinks, q)
    if q.device.type == "meta":
        return _shapes_only(q, v_pages.shape[-1], return_lse)
    if q.shape[0] == 0:
        return fallback.empty_batch(q, return_lse, v_pages.shape[-1])
    common = dict(softmax_scale=softmax_scale, softcap=softcap or None)

    def run():
        from .kernels import decode
        return decode.paged_decode_forward(
            q, k_pages, v_pages, page_table.int(), seqlens_k.int(), **_window_args(window, causal), **common
        )

    res = _kernel_call(q, run)
    fall_back = lambda lse: fallback.paged_attention(  # noqa: E731
        q, k_pages, v_pages, page_table, seqlens_k, causal=causal, window=window, return_lse=lse, **common
    )
    return _finish(res, fall_back, return_lse, sinks)


# ------------------------------------------------------------------------------ compile-safe forms
# The transformers backend calls these inside ``torch.compile``d models: no host-side decisions, one
# custom op per call, and the op itself chooses the kernel or its exact torch path at run time (on CPU,
# and on CUDA calls a kernel declines, warning once). Same layouts as the functions above; the window
# arrives folded (``left``/``right``, -1 unbounded, causal as ``right = 0``), inputs are trusted.


def attention_op(q, k, v, *, causal, softmax_scale, softcap, window_left, window_right, cu_seqlens_q=None,
                 cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, deterministic=False):  # fmt: skip
    """The differentiable forward op: ``(out, lse)`` as :func:`flash_attn_func` / :func:`flash_attn_varlen_func`
    (a v with a head dim of its own included: the op serves it, :mod:`hf_flashpatch.kernels.value_head_dim`)."""
    from .kernels import forward

    return forward.attention_forward(
        q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k, causal=causal, softmax_scale=softmax_scale, window_left=window_left,
        window_right=window_right, softcap=softcap, deterministic=deterministic, torch_fallback=True,
    )  # fmt: skip


def decode_op(q, k_cache, v_cache, cache_seqlens, key_starts, *, softmax_scale, softcap, window_left, window_right):
    """The decode op over a contiguous cache: ``(out, lse)``; row ``b`` sees keys
    ``[key_starts[b], cache_seqlens[b])`` (None: 0 and ``S_cache``), its queries the last of them. v may have a
    head dim of its own: the decode kernels serve 192/128, the op's exact torch path other pairs."""
    from .kernels import decode

    return decode.decode_forward(
        q, k_cache, v_cache, cache_seqlens, causal=False, softmax_scale=softmax_scale, window_left=window_left,
        window_right=window_right, softcap=softcap, key_starts=key_starts, torch_fallback=True,
    )  # fmt: skip


# ------------------------------------------------------------------------------ KV pools (continuous batching)
# A pool holds one layer's K (or V) rows, ``(num_slots, H_kv, D)``; a block-table pool
# ``(num_pages, page_size, H_kv, D)`` is the same pool flattened, slot = page * page_size + offset.
# transformers' continuous batching keeps such pools and hands the backend each token's slot.


def kv_append(k_new, v_new, k_pool, v_pool, slots, *, check_inputs=True) -> None:
    """Write new tokens' K/V rows into their slots of a pool, in place: ``k_pool[slots[t]] = k_new[t]`` (and V).

    ``k_new``/``v_new`` ``(T, H_kv, D)``; pools ``(num_slots, H_kv, D)`` of the same dtype (views into a
    larger cache are written where they are; V's rows may have a head dim ``D_v`` of their own, new and pool
    alike); ``slots`` int ``(T,)``. A negative slot skips its row
    (padding). Two rows with one slot leave one of them, unspecified which. ``check_inputs=False`` skips
    the check that every slot is below ``num_slots`` on CUDA (module docstring); unchecked, such rows
    are skipped. Without that check no path syncs with the host (CUDA-graph capturable), the torch
    fallback included.
    """
    check_flags(check_inputs=check_inputs)
    _check_kv_append(k_new, v_new, k_pool, v_pool, slots, check_inputs)
    if k_new.shape[0] == 0:
        return

    def run():
        from .kernels import decode

        decode.kv_append(k_new, v_new, k_pool, v_pool, slots)
        return True  # the kernel returns nothing; None would read as "take the fallback"

    if _kernel_call(k_new, run) is None:
        _kv_append_torch(k_new, v_new, k_pool, v_pool, slots)


def _check_kv_append(k_new, v_new, k_pool, v_pool, slots, check_inputs) -> None:
    from .validate import SUPPORTED_DTYPES, check_int_vector, check_writable_pool, content_checks_enabled

    named = (("k_new", k_new), ("v_new", v_new), ("k_pool", k_pool), ("v_pool", v_pool))
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D (rows, kv_heads, head_dim), got shape {tuple(t.shape)}")
    same_rows = k_new.shape[:2] == v_new.shape[:2] and k_pool.shape[:2] == v_pool.shape[:2]
    if not same_rows or k_new.shape[1:] != k_pool.shape[1:] or v_new.shape[1:] != v_pool.shape[1:]:
        raise ValueError(
            f"k_new/v_new must be (T, H_kv, D | D_v) and k_pool/v_pool (num_slots, H_kv, D | D_v) with the same T, "
            f"num_slots and H_kv, and each pool the head dim of its new rows, got {tuple(k_new.shape)}, "
            f"{tuple(v_new.shape)}, {tuple(k_pool.shape)}, {tuple(v_pool.shape)}"
        )
    if len({t.dtype for _, t in named}) != 1 or k_new.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"k_new, v_new, k_pool, v_pool must share a dtype, float16, bfloat16 or float32, got "
                        f"{[str(t.dtype) for _, t in named]}")  # fmt: skip
    if not torch.compiler.is_compiling() and k_pool.data_ptr() == v_pool.data_ptr() and k_pool.numel():
        raise ValueError(f"k_pool and v_pool are the same memory (shape {tuple(k_pool.shape)}): V's rows would "
                         "overwrite K's")  # fmt: skip
    if not isinstance(slots, torch.Tensor):
        raise TypeError(f"slots must be a torch.Tensor, got {type(slots).__name__}")
    check_int_vector(slots, "slots", k_new.shape[0], slots.device)  # the device: with the pools' below
    if len({t.device for _, t in named} | {slots.device}) != 1:
        raise ValueError(f"k_new, v_new, k_pool, v_pool, slots must be on one device, got "
                         f"{[str(t.device) for _, t in named]} and {slots.device}")  # fmt: skip
    for name, pool in (("k_pool", k_pool), ("v_pool", v_pool)):  # before either pool is written
        check_writable_pool(pool, name)
    if content_checks_enabled(check_inputs, slots):
        values = slots.tolist()  # the call's one sync on CUDA
        bad = next((t for t, s in enumerate(values) if s >= k_pool.shape[0]), None)
        if bad is not None:
            raise ValueError(
                f"slots[{bad}] = {values[bad]} is not a slot of this pool (valid: 0..{k_pool.shape[0] - 1}, "
                "negative = skip)"
            )


def _kv_append_torch(k_new, v_new, k_pool, v_pool, slots) -> None:
    """kv_append in torch, without a host sync (a boolean mask would need one): the rows to skip re-write
    the first kept row (or, when no row is kept, slot 0's current contents), so one ``index_put_`` per
    pool writes exactly the kept rows."""
    if k_pool.shape[0] == 0:
        return
    slots = slots.long()
    keep = (slots >= 0) & (slots < k_pool.shape[0])  # (T,)
    anchor = keep.int().argmax().view(1)  # (1,) first kept row, 0 when none; index_select keeps it on the device
    anchor_kept = keep.index_select(0, anchor)  # (1,)
    anchor_slot = torch.where(anchor_kept, slots.index_select(0, anchor), 0)  # (1,)
    index = torch.where(keep, slots, anchor_slot)  # (T,)
    for new, pool in ((k_new, k_pool), (v_new, v_pool)):
        anchor_row = torch.where(anchor_kept[:, None, None], new.index_select(0, anchor),
                                 pool.index_select(0, anchor_slot))  # (1, H_kv, D)  fmt: skip
        pool.index_put_((index,), torch.where(keep[:, None, None], new, anchor_row))  # (T, H_kv, D) rows


def flash_attn_slot_varlen_func(
    q, k_pool, v_pool, slots, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
    softmax_scale=None, window=None, softcap=None, return_lse=False, check_inputs=True,
):  # fmt: skip
    """Packed sequences whose keys live in a slot pool (inference only): q ``(T_q, H, D)`` and
    ``cu_seqlens_*``/``max_seqlen_*`` as in :func:`flash_attn_varlen_func`; pools ``(num_slots, H_kv, D)``
    (v_pool: ``D_v``; where it differs from ``D`` the call takes the torch fallback on CUDA);
    ``slots`` int ``(T_k,)``, the pool slot of every key, sequence after sequence (sequence ``i`` reads
    ``slots[cu_seqlens_k[i]:cu_seqlens_k[i+1]]``, each in ``[0, num_slots)``).

    Decode-like calls (few queries per sequence) read the pool in place with the slot decode kernel;
    the others gather their keys and run the varlen forward. Returns ``out (T_q, H, D_v)`` [, ``lse (H, T_q)``].
    ``check_inputs=False`` skips the checks of the tables' contents on CUDA (module docstring).
    """
    from .validate import check_varlen, content_checks_enabled

    check_qkv(q, k_pool, v_pool, packed=True, names=("q", "k_pool", "v_pool"))
    softcap = check_scalars(softmax_scale, softcap, window, causal)
    check_flags(return_lse=return_lse, check_inputs=check_inputs)
    if k_pool.shape[0] == 0:
        raise ValueError(f"k_pool/v_pool must hold at least one slot, got {tuple(k_pool.shape)}")
    if not isinstance(slots, torch.Tensor) or slots.dim() != 1 or slots.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"slots must be a 1-D int32/int64 tensor, got {_describe(slots)}")
    if slots.device != q.device:
        raise ValueError(f"slots must be on {q.device}, got {slots.device}")
    # The keys are the rows of slots: they stand in for k in the check of cu_seqlens_k.
    checked_end = check_varlen(q, slots, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, check_inputs,
                               keys_name="slots")  # fmt: skip
    if content_checks_enabled(check_inputs, slots):
        used = slots[: int(cu_seqlens_k[-1])].tolist()
        bad = next((t for t, s in enumerate(used) if not 0 <= s < k_pool.shape[0]), None)
        if bad is not None:
            raise ValueError(f"slots[{bad}] = {used[bad]} is not a slot of this pool (valid: 0..{k_pool.shape[0] - 1})")
    common = dict(softmax_scale=softmax_scale, softcap=softcap or None)
    window_args = _window_args(window, causal)

    def run():
        from .kernels import decode, forward
        try:
            return decode.slot_varlen_forward(
                q, k_pool, v_pool, slots, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), **window_args, **common
            )
        except KernelUnsupported:
            pass  # a prefill-heavy call (or a head dim decode does not serve): the forward kernel instead
        k, v = _gather_slots(k_pool, v_pool, slots)
        return forward.attention_forward(
            q, k, v, cu_seqlens_q=cu_seqlens_q.int(), cu_seqlens_k=cu_seqlens_k.int(),
            max_seqlen_q=int(max_seqlen_q), max_seqlen_k=int(max_seqlen_k), **window_args, **common,
        )  # fmt: skip

    res = _kernel_call(q, run)
    if res is None:
        k, v = _gather_slots(k_pool, v_pool, slots)
        res = fallback.varlen_attention(
            q, k, v, cu_seqlens_q, cu_seqlens_k, causal=causal, window=window, return_lse=True, **common
        )
    if checked_end is not None:
        res = _clear_padding_rows(res, checked_end)
    return res if return_lse else res[0]


def _gather_slots(k_pool, v_pool, slots):
    """``(T_k, H_kv, D)`` K and ``(T_k, H_kv, D_v)`` V, contiguous; slots clamped into the pool (unchecked tables
    never read outside it, as in the kernels)."""
    index = slots.long().clamp(0, k_pool.shape[0] - 1)
    return k_pool.index_select(0, index), v_pool.index_select(0, index)


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"{x.dtype} tensor of shape {tuple(x.shape)}"
    return type(x).__name__
