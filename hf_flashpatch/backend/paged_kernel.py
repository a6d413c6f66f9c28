"""The CUDA path of ``paged|<name>`` for transformers' continuous batching (transformers 5.x with
``paged|`` functions, e.g. 5.17).

Inputs (as transformers' ``paged|sdpa`` / ``paged|flash`` receive them): q ``(1, H, T_q, D)``; k/v
``(1, H_kv, T_new, D)`` hold only the new tokens; kwargs carry ``cache`` (a ``PagedAttentionCache``:
per layer a pool ``((num_blocks + 2) * block_size, H_kv, D)``), ``cu_seq_lens_q/k``,
``max_seqlen_q/k`` (or ``max_length_q/k``), and per layer group ``write_index`` / ``read_index``
(int64 physical slot of every new token / of every key of every sequence, new tokens included).

Per call, all on the current stream with no host synchronisation (CUDA-graph capturable):

1. the new K/V rows go into their ``write_index`` slots (the kv_append kernel);
2. attention reads the pool through ``read_index`` with the slot decode kernel, never gathering the
   cache, when sequences have few queries on average (``ceil(T_q / B) * group <= 64``: decode steps,
   including the padded decode batches of CUDA-graph runs, where ``max_seqlen_q`` is the padded
   token count);
3. otherwise (prefill chunks) K/V are gathered through ``read_index`` and the varlen forward kernel
   (:func:`hf_flashpatch.flash_attn_varlen_func`) runs on them.

Layers with a sliding window (rolling-buffer slots and sentinel reads), sinks, or a cache object
without the 5.17 layout take the torch path in :mod:`hf_flashpatch.backend.paged`. Returns
``(out (1, T_q, H, D), None)`` like that path.
"""

from __future__ import annotations

import torch

from ..errors import KernelUnsupported
from ..kernels import kernels_unavailable_reason


def _torch_path(module, query, key, value, attention_mask, dropout, scaling, kwargs):
    from .paged import paged_attention_forward_torch

    return paged_attention_forward_torch(module, query, key, value, attention_mask, dropout, scaling, **kwargs)


def _per_layer(value, layer_type: str):
    return value[layer_type] if isinstance(value, dict) else value


def paged_attention_forward_cuda(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """query ``(1, H, T_q, D)``, key/value ``(1, H_kv, T_new, D)`` -> ``(out (1, T_q, H, D), None)``."""
    from .attention import check_unsupported

    check_unsupported(module, dropout, kwargs)
    cache = kwargs.get("cache")
    layout_ok = cache is not None and hasattr(cache, "layer_index_to_group_indices") and hasattr(cache, "key_cache")
    if (
        not layout_ok
        or getattr(module, "sliding_window", None)
        or query.shape[0] != 1
        or kernels_unavailable_reason(query) is not None
        or query.dtype not in (torch.float16, torch.bfloat16)
        or key.dtype != query.dtype
    ):
        return _torch_path(module, query, key, value, attention_mask, dropout, scaling, kwargs)

    from ..api import flash_attn_varlen_func
    from ..kernels import decode

    layer_type = "full_attention"
    cu_q = kwargs["cu_seq_lens_q"]
    cu_k = _per_layer(kwargs["cu_seq_lens_k"], layer_type)
    max_q = int(_per_layer(kwargs.get("max_seqlen_q", kwargs.get("max_length_q")), layer_type))
    max_k = int(_per_layer(kwargs.get("max_seqlen_k", kwargs.get("max_length_k")), layer_type))
    group_idx, layer_in_group = cache.layer_index_to_group_indices[module.layer_idx]
    k_pool, v_pool = cache.key_cache[layer_in_group], cache.value_cache[layer_in_group]  # (slots, H_kv, D)
    write_index = kwargs["write_index"][group_idx]
    read_index = kwargs["read_index"][group_idx]

    q = query[0].transpose(0, 1)  # (T_q, H, D) view
    k_new = key[0].transpose(0, 1)  # (T_new, H_kv, D) view
    v_new = value[0].transpose(0, 1)
    written = min(write_index.shape[0], k_new.shape[0])
    try:
        decode.kv_append(k_new[:written], v_new[:written], k_pool, v_pool, write_index[:written])
    except KernelUnsupported:
        k_pool.index_copy_(0, write_index[:written], k_new[:written])
        v_pool.index_copy_(0, write_index[:written], v_new[:written])

    attn = dict(causal=True, softmax_scale=scaling, window=None, softcap=kwargs.get("softcap"))
    if read_index.numel() == 0:
        # No cached tokens in this batch (fresh prefills): the new K/V are all the keys.
        out = flash_attn_varlen_func(q, k_new, v_new, cu_q, cu_k, max_q, max_k, **attn)  # (T_q, H, D)
        return out[None], None
    try:
        # Declines (KernelUnsupported) prefill-heavy batches and head dims it does not serve.
        out, _ = decode.slot_varlen_forward(
            q, k_pool, v_pool, read_index, cu_q, cu_k, max_q, causal=True, softmax_scale=scaling,
            window_left=-1, window_right=0, softcap=kwargs.get("softcap"),
        )  # fmt: skip  (T_q, H, D)
        return out[None], None
    except KernelUnsupported:
        pass
    k_all = torch.index_select(k_pool, 0, read_index)  # (T_k, H_kv, D)
    v_all = torch.index_select(v_pool, 0, read_index)
    out = flash_attn_varlen_func(q, k_all, v_all, cu_q, cu_k, max_q, max_k, **attn)  # (T_q, H, D)
    return out[None], None
