"""The attention functions of transformers' continuous batching (``generate_batch``,
``generate(cache_implementation="paged")``). During a batch the model runs under its own name for them
(:func:`hf_flashpatch.backend.patch.continuous_batching_name`); the name is restored afterwards.

Continuous batching packs every scheduled request into one batch row: q is ``(1, H, T_q, D)``, and kwargs
carry the ``cache`` (a ``PagedAttentionCache``), ``cu_seq_lens_q/k`` and ``max_seqlen_q/k`` or
``max_length_q/k`` (per layer type when the model mixes full and sliding layers).

- transformers < 5.19 calls ``paged|<name>``, :func:`paged_attention_forward`, with k/v
  ``(1, H_kv, T_new, D)`` holding only the new tokens and ``read_index``/``write_index`` (pool slots per
  token): the attention function updates the cache. The slot route of :mod:`.paged_kernel` serves it
  where it can (write into the pool, read through ``read_index``); otherwise
  :func:`paged_attention_forward_torch` does what transformers' ``paged|sdpa`` does, without its dense
  ``T_q x T_k`` mask: ``cache.update`` writes the new K/V and gathers each sequence's K/V contiguously,
  then our varlen API runs causal attention per sequence (bottom-right aligned, which is what a request
  with cached tokens needs), with the layer's sliding window (the call's ``sliding_window`` or the module's)
  and attention sinks (GPT-OSS's ``s_aux``) folded in. The gather is the slow part that the slot route avoids.
- transformers >= 5.19 calls the name of :func:`continuous_batching_forward`. ``cache.update`` is called by
  the model from 5.24, and by this function on 5.19-5.23 (as transformers' own attention functions do there).
  In mixed or prefill batches it gathers each sequence's K/V, which
  :func:`hf_flashpatch.backend.attention.attention_forward` serves as packed varlen. In decode-only batches
  (when :func:`hf_flashpatch.backend.patch.allow_continuous_batching` has let transformers use its block-table
  decode path for us) the call carries ``block_table``, ``k_cache`` and ``v_cache`` and the new K/V only, and
  the block-table route of :mod:`.paged_kernel` writes and reads the pages.
"""

from __future__ import annotations

import torch

from ..validate import MAX_HEAD_DIM
from . import paged_kernel
from . import unsupported
from .attention import (
    _as_int,
    attention_forward,
    check_unsupported,
    common_dtype,
    layer_sliding_window,
    varlen_packed_row,
    window_from_sliding,
)


def _check_packed_call(query: torch.Tensor, kwargs: dict) -> None:
    if kwargs.get("cache") is None:
        raise ValueError(
            "paged attention was called without a paged cache (kwarg 'cache'); it serves continuous batching "
            "only. Use the plain attention name for a standard forward."
        )
    if query.shape[0] != 1:
        raise ValueError(f"paged attention expects one packed batch row, got query of shape {tuple(query.shape)}")


def paged_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                            **kwargs) -> tuple[torch.Tensor, None]:  # fmt: skip
    """``paged|<name>`` (transformers < 5.19). query ``(1, H, T_q, D)``, key/value ``(1, H_kv, T_new, D)``
    -> ``(out (1, T_q, H, D), None)``."""
    check_unsupported(module, dropout, kwargs)  # (the torch path folds sinks in)
    _check_packed_call(query, kwargs)
    if paged_kernel.slot_route_declines(module, query, value, kwargs) is None:
        return paged_kernel.slot_attention(module, query, key, value, scaling, kwargs)
    return paged_attention_forward_torch(module, query, key, value, attention_mask, dropout, scaling, **kwargs)


def paged_attention_forward_torch(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """The gather-then-varlen path of ``paged|<name>`` (any device); see the module docstring."""
    check_unsupported(module, dropout, kwargs)
    _check_packed_call(query, kwargs)
    sliding = layer_sliding_window(module, kwargs)
    layer_type = "sliding_attention" if sliding else "full_attention"
    cu_q, cu_k = kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"]
    max_q = kwargs.get("max_seqlen_q", kwargs.get("max_length_q"))
    max_k = kwargs.get("max_seqlen_k", kwargs.get("max_length_k"))
    if isinstance(cu_k, dict):
        cu_k = cu_k[layer_type]
    if isinstance(max_k, dict):
        max_k = max_k[layer_type]
    # (T_k, H_kv, D): this layer's cached K/V followed by the new tokens, sequence after sequence
    k_all, v_all = kwargs["cache"].update(
        key_states=key,
        value_states=value,
        layer_idx=module.layer_idx,
        read_index=kwargs["read_index"],
        write_index=kwargs["write_index"],
    )
    dtype = common_dtype(module, query, k_all, v_all)  # the pool may be stored in another dtype than q
    if max(query.shape[-1], v_all.shape[-1]) > MAX_HEAD_DIM:  # no kernel or API call takes it: transformers' sdpa
        # over the gathered keys, the packed sequences and the window as a dense mask (one warning)
        return unsupported.fallback_attention(
            module, query.to(dtype), k_all.to(dtype).transpose(0, 1)[None], v_all.to(dtype).transpose(0, 1)[None],
            None, dropout=dropout, scaling=scaling, sliding_window=sliding, softcap=kwargs.get("softcap"),
            is_causal=True, reason=unsupported.HEAD_DIM, cu_seq_lens_q=cu_q, cu_seq_lens_k=cu_k,
            **{name: kwargs[name] for name in ("s_aux", "sinks") if kwargs.get(name) is not None},
        )  # fmt: skip  (1, T_q, H, D)
    q = query.transpose(1, 2).to(dtype)  # (1, T_q, H, D) view
    k_all, v_all = k_all.to(dtype), v_all.to(dtype)
    out = varlen_packed_row(
        q, k_all[None], v_all[None], cu_q, cu_k, _as_int(max_q), _as_int(max_k),
        causal=True, softmax_scale=scaling, window=window_from_sliding(sliding), softcap=kwargs.get("softcap"),
        sinks=unsupported.sink_logits(kwargs),
    )  # fmt: skip  (1, T_q, H, D)
    return out.contiguous(), None


def continuous_batching_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                                **kwargs) -> tuple[torch.Tensor, None]:  # fmt: skip
    """The continuous-batching name on transformers >= 5.19: decode batches with a ``block_table`` take the
    block-table route, every other call is :func:`hf_flashpatch.backend.attention.attention_forward`'s.
    query ``(1, H, T_q, D)`` -> ``(out (1, T_q, H, D), None)``.

    On 5.19-5.23 the attention function updates the paged cache, as transformers' own sdpa and flash functions do
    there: ``cache.update`` writes the new K/V (or, with a block table, hands over this layer's pages) and picks this
    layer's ``cu_seq_lens_k`` / ``max_length_k`` out of the per-layer-type dicts, in ``kwargs``. From 5.24 the model
    calls it before the attention function, which then gets this layer's tensors."""
    if kwargs.get("cu_seq_lens_q") is None:
        # The model keeps continuous batching's keywords from its attention (StableLM, Nemotron on 5.19-5.23): every
        # request is packed into one row that no attention function can tell apart. transformers' own functions
        # then give wrong tokens; we refuse, and the batch's requests fail with this message.
        raise ValueError(
            f"{type(module).__name__} does not pass continuous batching's keywords (cache, cu_seq_lens_q/k) on to "
            "its attention function in this transformers release, so the packed requests cannot be told apart; "
            "generate_batch cannot serve this model here (generate can)"
        )
    cache = kwargs.get("cache")
    if cache is not None and isinstance(kwargs.get("cu_seq_lens_k"), dict):  # not updated for this layer yet
        key, value = cache.update(key_states=key, value_states=value, layer_idx=module.layer_idx, kwargs=kwargs)
        del kwargs["cache"]  # updated: transformers' own function, where the fallback calls it, must not do it again
    if kwargs.get("block_table") is None:
        return attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    check_unsupported(module, dropout, kwargs)  # (the block-table route folds sinks into the paged decode)
    return paged_kernel.block_table_attention(module, query, key, value, scaling, kwargs)
