"""``paged|<name>``: attention for transformers' continuous batching (``generate_batch``,
``generate(cache_implementation="paged")``).

Continuous batching packs every scheduled request into one batch row: q is ``(1, H, T_q, D)`` and k/v
``(1, H_kv, T_new, D)`` hold only the new tokens. kwargs carry the ``cache`` (a ``PagedAttentionCache``),
``cu_seq_lens_q/k`` and ``max_seqlen_q/k`` (per layer type when the model mixes full and sliding layers),
``read_index``/``write_index`` (physical cache slots per token) and ``block_table``.

- On CUDA, :func:`hf_flashpatch.backend.paged_kernel.paged_attention_forward_cuda` (the paged decode
  kernel, same signature and return as this function) serves the call when that module imports.
- Otherwise (CPU, or no paged kernel module): what transformers' ``paged|sdpa`` does, but without its dense
  ``T_q x T_k`` mask: ``cache.update`` writes the new K/V and gathers each sequence's K/V contiguously
  ``(T_k, H_kv, D)``, then our varlen API runs causal attention per sequence (bottom-right aligned, which
  is what a request with cached tokens needs). The gather is the slow part that a paged kernel avoids.

transformers >= 5.23 dropped the ``paged|`` functions: its models update the paged cache themselves and
call the plain attention function with ``cu_seq_lens_*``/``max_length_*``, which
:func:`hf_flashpatch.backend.attention.attention_forward` serves as packed varlen (see
:func:`hf_flashpatch.backend.patch.allow_continuous_batching`).
"""

from __future__ import annotations

import functools

import torch

from .attention import _as_int, check_unsupported, common_dtype, varlen_packed_row, window_from_sliding


@functools.lru_cache(maxsize=None)
def _cuda_paged_forward():
    """The CUDA paged attention function, or None when its module is absent or cannot import."""
    try:
        from .paged_kernel import paged_attention_forward_cuda
    except ImportError:
        return None
    return paged_attention_forward_cuda


def _layer_type(module) -> str:
    return "sliding_attention" if getattr(module, "sliding_window", None) else "full_attention"


def paged_attention_forward(
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
    if query.is_cuda:
        cuda_forward = _cuda_paged_forward()
        if cuda_forward is not None:
            return cuda_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    return paged_attention_forward_torch(module, query, key, value, attention_mask, dropout, scaling, **kwargs)


def paged_attention_forward_torch(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """The gather-then-varlen path (any device); see the module docstring."""
    check_unsupported(module, dropout, kwargs)
    cache = kwargs.get("cache")
    if cache is None:
        raise ValueError(
            "paged attention was called without a paged cache (kwarg 'cache'); it serves continuous batching "
            "only. Use the plain attention name for a standard forward."
        )
    if query.shape[0] != 1:
        raise ValueError(f"paged attention expects one packed batch row, got query of shape {tuple(query.shape)}")
    layer_type = _layer_type(module)
    cu_q, cu_k = kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"]
    max_q = kwargs.get("max_seqlen_q", kwargs.get("max_length_q"))
    max_k = kwargs.get("max_seqlen_k", kwargs.get("max_length_k"))
    if isinstance(cu_k, dict):
        cu_k = cu_k[layer_type]
    if isinstance(max_k, dict):
        max_k = max_k[layer_type]
    # (T_k, H_kv, D): this layer's cached K/V followed by the new tokens, sequence after sequence
    k_all, v_all = cache.update(
        key_states=key,
        value_states=value,
        layer_idx=module.layer_idx,
        read_index=kwargs["read_index"],
        write_index=kwargs["write_index"],
    )
    dtype = common_dtype(module, query, k_all, v_all)  # the pool may be stored in another dtype than q
    q = query.transpose(1, 2).to(dtype)  # (1, T_q, H, D) view
    k_all, v_all = k_all.to(dtype), v_all.to(dtype)
    sliding = getattr(module, "sliding_window", None)
    out = varlen_packed_row(
        q, k_all[None], v_all[None], cu_q, cu_k, _as_int(max_q), _as_int(max_k),
        causal=True, softmax_scale=scaling, window=window_from_sliding(sliding), softcap=kwargs.get("softcap"),
    )  # fmt: skip  (1, T_q, H, D)
    return out.contiguous(), None
