"""Split-KV decode over a contiguous, paged (block table) or slot-indexed KV cache (``cuda/decode.cu``).

Layout: q ``(B, S_q, H, D)`` (few query tokens: 1 for decoding, a handful for speculative decoding),
caches as described on each function (K rows of ``D``; V rows of ``D``, or of a ``D_v`` of their own where a
build takes the pair: 192/128, multi-head latent attention); ``out (B, S_q, H, D_v)`` in q's dtype, ``lse (B, H, S_q)`` fp32
(natural log, ``-inf`` and zero output for rows that see no key). Causal is bottom-right aligned.

One CUDA kernel template serves all three cache forms (the K/V row addressing is a compile-time
switch, ``cuda/decode_kv_address.cuh``). A CTA owns 16 query rows (``S_q x group`` heads of one KV
head), so each K/V tile is loaded once for the whole GQA group; the key range is cut into
``num_splits`` chunks when ``B * H_kv`` CTAs would leave SMs idle, and a combine kernel merges the
per-split ``(o, lse)``. Each launcher is a ``torch.library.custom_op`` with a fake implementation,
so ``torch.compile`` and CUDA-graph capture see an opaque, shape-known op; plain eager inference calls
the function behind the op directly (:func:`hf_flashpatch.kernels.call_op`). The kernels, split factor
and grid of a call come from :func:`decode_plan`, made once per shape (per generation step).

Declines (:class:`~hf_flashpatch.errors.KernelUnsupported`): fp32, head dims other than
32/64/80/96/128/256 (64 and 128 are the tuned ones) and q/k 192 with v 128, more than 64 query rows per KV head
(``S_q * group``: the forward kernel is the better tool), a last dim that is not contiguous or rows
that are not 16-byte aligned (the caches are never copied).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

from ..errors import KernelUnsupported
from . import (
    ScoreScales, aligned, call_op, fold_scores, fold_window, forward_torch, kernels_unavailable_reason,
    warn_fallback_once,
)
from .build import KernelBuild, device_arch, get_kernel, sm_count
from .decode_config import (  # noqa: F401 - re-exported: the decode module is where callers look for them
    ADDRESSING,
    MAX_ROWS_PER_KV_HEAD,
    ROWS_PER_CTA,
    SUPPORTED_HEAD_DIMS,
    TILE_KEYS,
    VALUE_HEAD_DIM_PAIRS,
    WARPS,
    DecodeConfig,
    all_builds,
)
from .heuristics import MIN_KEYS_PER_SPLIT, MIN_WAVES, choose_num_splits, ctas_per_sm  # noqa: F401 - re-exported


KV_APPEND_BUILD = KernelBuild("kv_append.cu")

# ------------------------------------------------------------------------------------ checks


def _check_common(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, kv_heads: int, seqlen_q: int):
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise KernelUnsupported(f"decode kernel needs fp16/bf16, got {q.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise KernelUnsupported(f"decode kernel needs one dtype for q/k/v, got {q.dtype}, {k.dtype}, {v.dtype}")
    head_dim = q.shape[-1]
    if k.shape[-1] != head_dim or not DecodeConfig.served(head_dim, v.shape[-1]):
        raise KernelUnsupported(
            f"decode kernel serves head dims {SUPPORTED_HEAD_DIMS} (v's the same) and q/k, v pairs "
            f"{VALUE_HEAD_DIM_PAIRS}, got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    group = heads // kv_heads
    if seqlen_q * group > MAX_ROWS_PER_KV_HEAD:
        raise KernelUnsupported(
            f"decode kernel serves S_q * group <= {MAX_ROWS_PER_KV_HEAD}, got S_q={seqlen_q}, group={group}"
        )
    for name, t in (("k", k), ("v", v)):
        strides = t.stride()
        if strides[-1] != 1 or any(s % 8 for s in strides[:-1]):
            raise KernelUnsupported(
                f"decode kernel needs {name} with a contiguous last dim and 16-byte aligned rows, got strides "
                f"{t.stride()} for shape {tuple(t.shape)}"
            )
        if not torch.compiler.is_compiling() and t.data_ptr() % 16:
            raise KernelUnsupported(f"decode kernel needs a 16-byte aligned {name}, got address {t.data_ptr():#x}")


def _aligned_q(q: torch.Tensor) -> torch.Tensor:
    """q as the kernel reads it: 16-byte aligned rows (q is small, so a copy is cheap when needed). Called before the
    op too, where torch.compile traces q without an address: its strides only there."""
    return aligned(q, check_address=not torch.compiler.is_compiling())


def _scales(head_dim: int, softmax_scale, softcap) -> ScoreScales:
    """The split kernel's ``ScoreScale``: see :func:`hf_flashpatch.kernels.fold_scores`."""
    return fold_scores(softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim), softcap)


# ------------------------------------------------------------------------------------ launcher


class DecodePlan(NamedTuple):
    """What every layer of one generation step shares: the kernels, the split-KV factor and the grid."""

    config: DecodeConfig
    split_kernel: object  # build.Kernel
    combine_kernel: object | None  # build.Kernel when num_splits > 1
    num_splits: int
    row_tiles: int  # query-row tiles per (KV head, sequence) in the grid


@functools.lru_cache(maxsize=64)
def decode_plan(addressing: str, head_dim: int, bf16: bool, softcap: bool, batch: int, seqlen_q: int, total_q: int,
                kv_heads: int, group: int, typical_keys: int, device_index: int,
                head_dim_v: int | None = None) -> DecodePlan:  # fmt: skip
    """The launch plan for these shapes, made once and reused (FlashInfer's plan/run split).

    The key is shapes only, since the kernels read lengths, page tables and slots from device memory:
    every layer of a generation step asks for the same plan, the first one makes it and the others
    find it here; the next step of a growing cache (one more key) makes a new one. Workspaces are not
    part of the plan: the per-split partials come from torch's caching allocator per call, which keeps
    them stream-ordered across threads and valid inside CUDA-graph captures."""
    device = torch.device("cuda", device_index)
    config = DecodeConfig(head_dim, bf16, addressing, softcap, head_dim_v=head_dim_v)
    build = config.build(device_arch(device))
    split_kernel = get_kernel(build, "hfp_decode_split", device)
    # Row tiles in the grid: enough for every row of a batched call; for packed q (where seqlen_q is
    # only an upper bound) at most MAX_ROWS_PER_KV_HEAD rows' worth, and each CTA loops over the
    # further tiles of a sequence that has more queries (cuda/decode.cu decode_split).
    row_tiles = min(-(-seqlen_q * group // ROWS_PER_CTA), -(-MAX_ROWS_PER_KV_HEAD // ROWS_PER_CTA))
    typical_rows = -(-total_q // batch) * group  # packed: the mean queries per sequence
    ctas = min(row_tiles, -(-typical_rows // ROWS_PER_CTA)) * kv_heads * batch
    num_splits = choose_num_splits(ctas, typical_keys, sm_count(device_index), ctas_per_sm(split_kernel.shared_bytes), MIN_WAVES)
    combine_kernel = get_kernel(build, "hfp_decode_combine", device) if num_splits > 1 else None
    return DecodePlan(config, split_kernel, combine_kernel, num_splits, row_tiles)


def _launch(
    *, addressing, q, q_strides, cu_q, seqlen_q, total_q, k, v, k_strides, v_strides, seqlens, default_seqlen, index,
    index_stride, page_size, cu_k, out, out_strides, lse, lse_strides, batch, heads, kv_heads, typical_keys,
    softmax_scale, softcap, window_left, window_right, key_starts=None,
):  # fmt: skip
    """Launch the split kernel (and the combine kernel when splitting) on torch's current stream."""
    head_dim, head_dim_v = q.shape[-1], v.shape[-1]
    plan = decode_plan(addressing, head_dim, q.dtype == torch.bfloat16, bool(softcap), batch, seqlen_q, total_q,
                       kv_heads, heads // kv_heads, typical_keys, q.device.index or 0, head_dim_v)  # fmt: skip
    num_splits = plan.num_splits
    o_part = lse_part = None
    if num_splits > 1:
        # (split, flat token, H, D_v) and (split, flat token, H)
        o_part = torch.empty(num_splits, total_q, heads, head_dim_v, device=q.device, dtype=torch.float32)
        lse_part = torch.empty(num_splits, total_q, heads, device=q.device, dtype=torch.float32)
    scales = _scales(head_dim, softmax_scale, softcap)
    args = (
        q, *q_strides, cu_q, seqlen_q,
        k, v, *k_strides, *v_strides, seqlens, key_starts, default_seqlen, index, index_stride, page_size, cu_k,
        k.shape[0],  # pool rows: the kernel clamps page ids / slots into them (cuda/decode_kv_address.cuh)
        out, *out_strides, lse, *lse_strides, o_part, lse_part,
        batch, heads, kv_heads, num_splits, plan.row_tiles, total_q, *scales, window_left,
        window_right,
    )  # fmt: skip
    tensors = [t for t in (q, cu_q, k, v, seqlens, key_starts, index, cu_k, out, lse, o_part, lse_part) if t is not None]
    params = plan.split_kernel.pack(args)  # both kernels take DecodeParams (cuda/decode_common.cuh): one buffer
    plan.split_kernel.launch(
        (plan.row_tiles * num_splits, kv_heads, batch), (WARPS * 32, 1, 1), params,
        shared_bytes=plan.split_kernel.shared_bytes, tensors=tensors,
    )  # fmt: skip
    if num_splits > 1:
        rows = total_q * heads
        plan.combine_kernel.launch((-(-rows // 4), 1, 1), (128, 1, 1), params, tensors=tensors)


# ------------------------------------------------------------------------------------ custom ops


def _decode_impl(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor | None,
    key_starts: torch.Tensor | None, softmax_scale: float, window_left: int, window_right: int, softcap: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Row ``b`` sees keys ``[key_starts[b], cache_seqlens[b])`` (defaults 0 and ``S_cache``). The kernel
    where it serves the call, else the exact torch path (CPU; CUDA calls it declines, warning once)."""
    batch, seqlen_q, heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    try:
        unavailable = kernels_unavailable_reason(q)
        if unavailable is not None:
            raise KernelUnsupported(unavailable)
        _check_common(q, k_cache, v_cache, heads, kv_heads, seqlen_q)
    except KernelUnsupported as exc:
        if q.is_cuda:
            warn_fallback_once("decode", str(exc))
        return forward_torch.attention_with_lse(
            q, k_cache, v_cache, softmax_scale, window_left, window_right, softcap, key_starts, cache_seqlens
        )
    return _decode_launch(q, k_cache, v_cache, cache_seqlens, key_starts, softmax_scale, window_left, window_right,
                          softcap)  # fmt: skip


def _decode_launch(q, k_cache, v_cache, cache_seqlens, key_starts, softmax_scale, window_left, window_right, softcap):
    """The kernel part of :func:`_decode_impl`, for calls already checked."""
    batch, seqlen_q, heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    q = _aligned_q(q)
    out = q.new_empty(batch, seqlen_q, heads, v_cache.shape[-1])  # (B, S_q, H, D_v)
    lse = torch.empty(batch, heads, seqlen_q, device=q.device, dtype=torch.float32)  # (B, H, S_q)
    _launch(
        addressing="contiguous", q=q, q_strides=q.stride()[:3], cu_q=None, seqlen_q=seqlen_q, total_q=batch * seqlen_q,
        k=k_cache, v=v_cache, k_strides=k_cache.stride()[:3], v_strides=v_cache.stride()[:3],
        seqlens=cache_seqlens, default_seqlen=k_cache.shape[1], index=None, index_stride=0, page_size=1, cu_k=None,
        out=out, out_strides=out.stride()[:3], lse=lse, lse_strides=lse.stride(), batch=batch, heads=heads,
        kv_heads=kv_heads, typical_keys=k_cache.shape[1], softmax_scale=softmax_scale, softcap=softcap,
        window_left=window_left, window_right=window_right, key_starts=key_starts,
    )  # fmt: skip
    return out, lse


_decode_op = torch.library.custom_op("hf_flashpatch::decode", mutates_args=())(_decode_impl)


def _fake_batched(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *_args) -> tuple[torch.Tensor, torch.Tensor]:
    """Shapes of a batched decode: out ``(B, S_q, H, D_v)`` contiguous, lse ``(B, H, S_q)`` fp32."""
    batch, seqlen_q, heads, _ = q.shape
    return q.new_empty(batch, seqlen_q, heads, v.shape[-1]), q.new_empty(batch, heads, seqlen_q, dtype=torch.float32)


_decode_op.register_fake(_fake_batched)


def _paged_decode_impl(
    q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, page_table: torch.Tensor, seqlens_k: torch.Tensor,
    softmax_scale: float, window_left: int, window_right: int, softcap: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    batch, seqlen_q, heads, head_dim = q.shape
    page_size, kv_heads = k_pages.shape[1], k_pages.shape[2]
    out = q.new_empty(batch, seqlen_q, heads, v_pages.shape[-1])  # (B, S_q, H, D_v)
    lse = torch.empty(batch, heads, seqlen_q, device=q.device, dtype=torch.float32)  # (B, H, S_q)
    _launch(
        addressing="block_table", q=q, q_strides=q.stride()[:3], cu_q=None, seqlen_q=seqlen_q, total_q=batch * seqlen_q,
        k=k_pages, v=v_pages, k_strides=k_pages.stride()[:3], v_strides=v_pages.stride()[:3],
        seqlens=seqlens_k, default_seqlen=page_table.shape[1] * page_size if k_pages.shape[0] else 0, index=page_table,
        index_stride=page_table.stride(0),
        page_size=page_size, cu_k=None, out=out, out_strides=out.stride()[:3], lse=lse, lse_strides=lse.stride(),
        batch=batch, heads=heads, kv_heads=kv_heads, typical_keys=page_table.shape[1] * page_size,
        softmax_scale=softmax_scale, softcap=softcap, window_left=window_left, window_right=window_right,
    )  # fmt: skip
    return out, lse


_paged_decode_op = torch.library.custom_op("hf_flashpatch::paged_decode", mutates_args=())(_paged_decode_impl)
_paged_decode_op.register_fake(_fake_batched)


def _slot_decode_impl(
    q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor, cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor, max_seqlen_q: int, softmax_scale: float, window_left: int, window_right: int,
    softcap: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Packed form: q ``(T_q, H, D)``; sequence b owns q rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]``
    (at most ``max_seqlen_q``) and keys ``slots[cu_seqlens_k[b]:cu_seqlens_k[b+1]]``. Rows outside
    every sequence get zeros / ``-inf``. Returns ``out (T_q, H, D_v)``, ``lse (H, T_q)``."""
    total_q, heads, _ = q.shape
    kv_heads = k_pool.shape[1]
    batch = cu_seqlens_k.shape[0] - 1
    out = q.new_zeros(total_q, heads, v_pool.shape[-1])  # (T_q, H, D_v)
    lse = torch.full((heads, total_q), float("-inf"), device=q.device, dtype=torch.float32)  # (H, T_q)
    if total_q == 0 or batch == 0:
        return out, lse
    _launch(
        addressing="slot", q=q, q_strides=(0, q.stride(0), q.stride(1)), cu_q=cu_seqlens_q, seqlen_q=max_seqlen_q,
        total_q=total_q,
        k=k_pool, v=v_pool, k_strides=(0, k_pool.stride(0), k_pool.stride(1)),
        v_strides=(0, v_pool.stride(0), v_pool.stride(1)), seqlens=None,
        default_seqlen=slots.shape[0] if k_pool.shape[0] else 0, index=slots,
        index_stride=0, page_size=1, cu_k=cu_seqlens_k, out=out, out_strides=(0, out.stride(0), out.stride(1)),
        lse=lse, lse_strides=(0, lse.stride(0), lse.stride(1)), batch=batch, heads=heads, kv_heads=kv_heads,
        typical_keys=max(1, slots.shape[0] // batch), softmax_scale=softmax_scale, softcap=softcap,
        window_left=window_left, window_right=window_right,
    )  # fmt: skip
    return out, lse


_slot_decode_op = torch.library.custom_op("hf_flashpatch::slot_decode", mutates_args=())(_slot_decode_impl)


@_slot_decode_op.register_fake
def _(q, k_pool, v_pool, slots, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale, window_left, window_right,
      softcap):  # fmt: skip
    total_q, heads, _ = q.shape
    return q.new_empty(total_q, heads, v_pool.shape[-1]), q.new_empty(heads, total_q, dtype=torch.float32)


def _kv_append_impl(
    k_new: torch.Tensor, v_new: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor
) -> None:
    """``k_pool[slots[t]] = k_new[t]`` (and V): new ``(T, H_kv, D)`` (V: ``D_v``), pools ``(num_slots, H_kv, D)``
    (V: ``D_v``), slots int64 ``(T,)``, negative = skip."""
    num_tokens, kv_heads, head_dim = k_new.shape
    if num_tokens == 0:
        return
    kernel = get_kernel(
        KernelBuild("kv_append.cu", (), device_arch(k_new.device)), "hfp_kv_append", k_new.device
    )
    chunk = 8  # elements per 16-byte chunk (2-byte dtypes)
    row_chunks, v_row_chunks = head_dim // chunk, v_new.shape[-1] // chunk
    total = num_tokens * kv_heads * max(row_chunks, v_row_chunks)
    blocks = max(1, min(-(-total // 256), 4 * sm_count(k_new.device.index or 0)))
    kernel(
        (blocks, 1, 1), (256, 1, 1),
        k_new, v_new, k_new.stride(0) // chunk, k_new.stride(1) // chunk, v_new.stride(0) // chunk,
        v_new.stride(1) // chunk, k_pool, v_pool, k_pool.stride(0) // chunk, k_pool.stride(1) // chunk,
        v_pool.stride(0) // chunk, v_pool.stride(1) // chunk, slots, num_tokens, kv_heads, row_chunks, v_row_chunks,
        min(k_pool.shape[0], v_pool.shape[0]), tensors=(k_new, v_new, k_pool, v_pool, slots),
    )  # fmt: skip


_kv_append_op = torch.library.custom_op("hf_flashpatch::kv_append", mutates_args=("k_pool", "v_pool"))(
    _kv_append_impl
)


@_kv_append_op.register_fake
def _(k_new, v_new, k_pool, v_pool, slots):
    return None


# ------------------------------------------------------------------------------------ public functions


def decode_forward(q, k_cache, v_cache, cache_seqlens, *, causal, softmax_scale, window_left, window_right, softcap,
                   key_starts=None, torch_fallback=False):  # fmt: skip
    """Contiguous cache. q ``(B, S_q, H, D)``; k/v cache ``(B, S_cache, H_kv, D)`` with any strides
    (last dim contiguous; a transformers ``(B, H_kv, S, D)`` cache passed as ``.transpose(1, 2)`` is
    read in place); ``cache_seqlens`` int32 ``(B,)`` or None (= S_cache); ``key_starts`` int32 ``(B,)``
    or None (= 0): row ``b`` sees keys ``[key_starts[b], cache_seqlens[b])`` (left padding), and its
    queries are the last tokens of that range. ``causal`` means ``window_right = 0`` (bottom-right
    aligned). v may have rows of ``D_v`` (module docstring). Returns ``out (B, S_q, H, D_v)``, ``lse (B, H, S_q)``.

    Raises :class:`KernelUnsupported` up front for calls the kernel does not serve; with
    ``torch_fallback=True`` the op serves them with its torch path (a run-time choice inside the op, so
    the call traces to one graph node under ``torch.compile``)."""
    window_left, window_right = fold_window(causal, window_left, window_right)
    batch, seqlen_q, heads, _ = q.shape
    kv_heads = k_cache.shape[2]
    eager_impl = _decode_impl
    if not torch_fallback:
        _check_common(q, k_cache, v_cache, heads, kv_heads, seqlen_q)
        if not torch.compiler.is_compiling() and kernels_unavailable_reason(q) is None:
            eager_impl = _decode_launch  # checked: in eager mode the op's function may skip to the launch
    if cache_seqlens is not None:
        cache_seqlens = cache_seqlens.to(device=q.device, dtype=torch.int32).contiguous()
    if key_starts is not None:
        key_starts = key_starts.to(device=q.device, dtype=torch.int32).contiguous()
    return call_op(
        _decode_op, eager_impl, q, k_cache, v_cache, cache_seqlens, key_starts, _scale_or_default(q, softmax_scale),
        int(window_left), int(window_right), float(softcap or 0.0),
    )  # fmt: skip


def paged_decode_forward(q, k_pages, v_pages, page_table, seqlens_k, *, causal, softmax_scale, window_left,
                         window_right, softcap):  # fmt: skip
    """Block-table pool. q ``(B, S_q, H, D)``; pools ``(num_pages, page_size, H_kv, D)`` (any page
    size; V: ``D_v``); ``page_table`` int32 ``(B, max_pages)``; ``seqlens_k`` int32 ``(B,)``."""
    window_left, window_right = fold_window(causal, window_left, window_right)
    batch, seqlen_q, heads, _ = q.shape
    _check_common(q, k_pages, v_pages, heads, k_pages.shape[2], seqlen_q)
    page_table = page_table.to(device=q.device, dtype=torch.int32)
    if page_table.stride(-1) != 1:
        page_table = page_table.contiguous()
    seqlens_k = seqlens_k.to(device=q.device, dtype=torch.int32).contiguous()
    return call_op(
        _paged_decode_op, _paged_decode_impl, _aligned_q(q), k_pages, v_pages, page_table, seqlens_k,
        _scale_or_default(q, softmax_scale),
        int(window_left), int(window_right), float(softcap or 0.0),
    )  # fmt: skip


def slot_decode_forward(q, k_pool, v_pool, slots, cu_seqlens_k, *, causal, softmax_scale, window_left, window_right,
                        softcap):  # fmt: skip
    """Slot pool. q ``(B, S_q, H, D)``; pools ``(num_slots, H_kv, D)`` (V: ``D_v``); ``slots`` int32/int64
    ``(total_k,)`` (physical slot of each logical token); ``cu_seqlens_k (B + 1,)``."""
    batch, seqlen_q, heads, head_dim = q.shape
    cu_q = torch.arange(0, (batch + 1) * seqlen_q, seqlen_q, device=q.device, dtype=torch.int32)
    out, lse = slot_varlen_forward(
        q.reshape(batch * seqlen_q, heads, head_dim), k_pool, v_pool, slots, cu_q, cu_seqlens_k, seqlen_q,
        causal=causal, softmax_scale=softmax_scale, window_left=window_left, window_right=window_right,
        softcap=softcap,
    )  # fmt: skip
    # (T_q, H, D_v) -> (B, S_q, H, D_v); lse (H, T_q) -> (B, H, S_q)
    return out.view(batch, seqlen_q, heads, v_pool.shape[-1]), lse.view(heads, batch, seqlen_q).transpose(0, 1).contiguous()


def slot_varlen_forward(q, k_pool, v_pool, slots, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, *, causal, softmax_scale,
                        window_left, window_right, softcap):  # fmt: skip
    """Packed slot form (continuous batching): q ``(T_q, H, D)``, sequence b owns q rows
    ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` (``<= max_seqlen_q``, a host int) and keys
    ``slots[cu_seqlens_k[b]:cu_seqlens_k[b+1]]``. Returns ``out (T_q, H, D_v)``, ``lse (H, T_q)``."""
    window_left, window_right = fold_window(causal, window_left, window_right)
    heads = q.shape[1]
    num_seqs = max(1, cu_seqlens_k.shape[0] - 1)
    # Packed batches of CUDA-graph runs pad max_seqlen_q to the token count, so judge by the mean
    # queries per sequence (host-known shapes): decode-like batches run here, prefill-heavy ones
    # decline to the forward kernel. A sequence with more queries is still served (CTAs loop).
    mean_queries = min(int(max_seqlen_q), -(-q.shape[0] // num_seqs))
    _check_common(q, k_pool, v_pool, heads, k_pool.shape[1], mean_queries)
    slots = slots.to(device=q.device, dtype=torch.int64).contiguous()
    return call_op(
        _slot_decode_op, _slot_decode_impl, _aligned_q(q), k_pool, v_pool, slots,
        cu_seqlens_q.to(device=q.device, dtype=torch.int32).contiguous(),
        cu_seqlens_k.to(device=q.device, dtype=torch.int32).contiguous(), int(max_seqlen_q),
        _scale_or_default(q, softmax_scale), int(window_left), int(window_right), float(softcap or 0.0),
    )  # fmt: skip


def kv_append(k_new, v_new, k_pool, v_pool, slots) -> None:
    """Write new rows into a pool in place: ``k_pool[slots[t]] = k_new[t]`` (and V).

    new ``(T, H_kv, D)``, pools ``(num_slots, H_kv, D)`` (V: new and pool ``D_v``; a block pool ``(pages, page_size, H_kv, D)``
    flattened), slots int ``(T,)`` (negative: skip). Same dtype; rows 16-byte aligned."""
    if k_new.dtype not in (torch.float16, torch.bfloat16) or k_pool.dtype != k_new.dtype:
        raise KernelUnsupported(f"kv_append needs fp16/bf16 of one dtype, got {k_new.dtype} into {k_pool.dtype}")
    for name, t in (("k_new", k_new), ("v_new", v_new), ("k_pool", k_pool), ("v_pool", v_pool)):
        misaligned = not torch.compiler.is_compiling() and t.data_ptr() % 16
        if misaligned or t.stride(-1) != 1 or any(s % 8 for s in t.stride()[:-1]) or t.shape[-1] % 8:
            raise KernelUnsupported(
                f"kv_append needs 16-byte aligned rows of {name}, got strides {t.stride()} shape {tuple(t.shape)}"
            )
    slots = slots.to(device=k_new.device, dtype=torch.int64).contiguous()
    _kv_append_op(k_new, v_new, k_pool, v_pool, slots)  # always the op: it bumps the pools' version counters


def _scale_or_default(q: torch.Tensor, softmax_scale) -> float:
    return float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
