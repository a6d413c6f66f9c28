"""The pool routes of continuous batching: write the new K/V into transformers' paged cache and attend
through its index, never gathering the cache. Both reach the kernels through the public API
(:func:`hf_flashpatch.api.kv_append` and the pool attention functions), so on CPU, or wherever the
kernels decline, the same route runs with the API's torch fallback.

transformers hands the cache over in one of two forms; each route returns ``(out (1, T_q, H, D), None)``:

- **slot form** (transformers < 5.19, ``paged|<name>``), :func:`slot_attention`: q ``(1, H, T_q, D)``,
  k/v ``(1, H_kv, T_new, D)`` hold only the new tokens; kwargs carry ``cache`` (a ``PagedAttentionCache``:
  per layer a pool ``(slots, H_kv, D)``, kept per layer group on 5.17 and in the group's allocator on 5.18),
  ``cu_seq_lens_q/k``,
  ``max_seqlen_q/k`` (or ``max_length_q/k``) and per layer group ``write_index`` / ``read_index`` (int64
  pool slot of every new token / of every key of every sequence, new tokens included). The new rows go
  to their ``write_index`` slots; :func:`hf_flashpatch.api.flash_attn_slot_varlen_func` reads the keys
  through ``read_index`` (the slot decode kernel for decode-like batches, gather + varlen forward for
  prefill chunks).
- **block-table form** (transformers >= 5.19, decode-only batches, one new token per sequence),
  :func:`block_table_attention`: transformers' ``cache.update`` leaves the new K/V to the attention
  function (for flash-attn it is ``flash_attn_with_kvcache``'s fused write) and puts ``block_table``
  ``(B, max_pages)`` int32 (-1 past a sequence's pages), ``k_cache``/``v_cache`` ``(num_pages, page_size,
  H_kv, D)`` and ``cu_seq_lens_k`` (each sequence's length, new token included) in kwargs. The new rows
  go to their slots, then :func:`hf_flashpatch.api.flash_attn_paged_decode` reads the pages.

Everything runs on the current stream without a host sync, so CUDA graphs capture it (transformers
replays decode steps from graphs, with padding sequences of length 0 that read and write nothing).

Both pool forms hold K and V at one head dim per layer. A model whose V has a head dim of its own
(multi-head latent attention: DeepSeek-V2/V3 and the rest of that family, whose transformers cache holds the
compressed latents and expands them into K/V after reading) never takes these routes: the slot route
declines it and the block-table decode path is kept off for it (:func:`block_table_route_unavailable`), so
its continuous batching runs the gathered path, which our varlen API serves; a block-table call that still
reaches :func:`block_table_attention` with K/V that do not fit the pool is refused by name, never mis-served.

Whether the routes serve at all is decided here (:func:`slot_route_declines`,
:func:`block_table_route_unavailable`) by ``kernels_unavailable_reason``: where the kernels cannot run
(CPU, no pycuda/nvcc), the routes would only trade transformers' gather for the API's gathering
fallback, so the older gathered paths of :mod:`.paged` serve instead. Tests that check the routes on
CPU monkeypatch this module's ``kernels_unavailable_reason``.
"""

from __future__ import annotations

import torch

from .. import api  # called as api.<fn> so that a monkeypatched function is seen (tests count calls)
from ..kernels import kernels_unavailable_reason
from ..validate import MAX_HEAD_DIM
from . import unsupported
from .attention import layer_sliding_window, once_per_forward


def _per_layer(value, layer_type: str):
    return value[layer_type] if isinstance(value, dict) else value


def _window(sliding_window) -> tuple[int, int] | None:
    """transformers' ``sliding_window=W``: each query sees itself and the ``W - 1`` keys before it."""
    return (int(sliding_window) - 1, 0) if sliding_window else None


# ------------------------------------------------------------------------------------ slot form (< 5.19)


def slot_route_declines(module, query: torch.Tensor, value: torch.Tensor, kwargs: dict) -> str | None:
    """Why :func:`slot_attention` should not serve this ``paged|<name>`` call (None: it should). query
    ``(1, H, T_q, D)``, value ``(1, H_kv, T_new, D_v)``."""
    if value.shape[-1] != query.shape[-1]:
        return f"a value head dim of its own ({value.shape[-1]}, query/key {query.shape[-1]}): the pool keeps one"
    if query.shape[-1] > MAX_HEAD_DIM:
        return f"head dim {query.shape[-1]} (the kernels take up to {MAX_HEAD_DIM})"
    cache = kwargs.get("cache")
    layer = getattr(module, "layer_idx", None)
    if _slot_pools_of(cache, layer) is None:
        return f"a cache without the slot pools of transformers 5.17-5.18 ({type(cache).__name__})"
    if unsupported.sink_logits(kwargs) is not None:
        return "attention sinks (the slot route does not fold them in; the gather-then-varlen route does)"
    # The cache knows a layer's window too, where the call and the module do not say it.
    cache_window = getattr(cache, "sliding_windows", {}).get(layer, 1)  # 5.17
    sliding_allocator = getattr(getattr(cache, "layer_to_allocator", {}).get(layer), "sliding_window", None)  # 5.18
    if cache_window > 1 or sliding_allocator or layer_sliding_window(module, kwargs):
        return "a sliding-window layer (rolling-buffer slots and sentinel reads)"
    return kernels_unavailable_reason(query)


def _slot_pools_of(cache, layer: int | None) -> tuple[torch.Tensor, torch.Tensor, int] | None:
    """``(k_pool, v_pool, group)`` of a layer: its ``(slots, H_kv, D)`` pools, and the index of its layer group in
    ``write_index`` / ``read_index``. transformers 5.17 keeps the pools per group on the cache, 5.18 in the layer
    group's allocator. None for any other cache."""
    if layer is None or cache is None:
        return None
    if hasattr(cache, "layer_index_to_group_indices") and hasattr(cache, "key_cache"):  # 5.17
        group, in_group = cache.layer_index_to_group_indices[layer]
        return cache.key_cache[in_group], cache.value_cache[in_group], group
    allocator = getattr(cache, "layer_to_allocator", {}).get(layer)  # 5.18
    views = getattr(allocator, "_kv_token_views", {}).get(layer)
    if views is None:
        return None
    # K and V are views of one buffer, V's shifted one page further; every slot the tables hold lies in both
    slots = min(views[0].shape[0], views[1].shape[0])
    return views[0][:slots], views[1][:slots], allocator.index


def slot_attention(module, query, key, value, scaling, kwargs) -> tuple[torch.Tensor, None]:
    """The slot form (module docstring); only for calls :func:`slot_route_declines` accepts."""
    layer_type = "full_attention"  # sliding layers are declined
    cu_q = kwargs["cu_seq_lens_q"]
    cu_k = _per_layer(kwargs["cu_seq_lens_k"], layer_type)
    max_q = int(_per_layer(kwargs.get("max_seqlen_q", kwargs.get("max_length_q")), layer_type))
    max_k = int(_per_layer(kwargs.get("max_seqlen_k", kwargs.get("max_length_k")), layer_type))
    k_pool, v_pool, group_idx = _slot_pools_of(kwargs["cache"], module.layer_idx)  # (slots, H_kv, D) each
    write_index = kwargs["write_index"][group_idx]  # (T_new,) int64
    read_index = kwargs["read_index"][group_idx]  # (T_k,) int64

    # The pool is in the model's dtype; what is written into it and read with it must match.
    q = query[0].transpose(0, 1).to(k_pool.dtype)  # (T_q, H, D) view
    k_new = key[0].transpose(0, 1).to(k_pool.dtype)  # (T_new, H_kv, D) view
    v_new = value[0].transpose(0, 1).to(k_pool.dtype)
    written = min(write_index.shape[0], k_new.shape[0])
    # The tables are transformers' own (checking them would cost a host sync per layer).
    api.kv_append(k_new[:written], v_new[:written], k_pool, v_pool, write_index[:written], check_inputs=False)

    attn = dict(causal=True, softmax_scale=scaling, softcap=kwargs.get("softcap"))
    if read_index.numel() == 0:
        # No cached tokens in this batch (fresh prefills): the new K/V are all the keys.
        out = api.flash_attn_varlen_func(q, k_new, v_new, cu_q, cu_k, max_q, max_k, check_inputs=False, **attn)
    else:
        out = api.flash_attn_slot_varlen_func(
            q, k_pool, v_pool, read_index, cu_q, cu_k, max_q, max_k, check_inputs=False, **attn
        )  # (T_q, H, D)
    return out[None], None


# ------------------------------------------------------------------------------------ block-table form (>= 5.19)


def block_table_route_unavailable(config=None) -> str | None:
    """Why transformers should not send decode batches of a model with ``config`` to :func:`block_table_attention`
    here (None: it should). Decided before the pool exists, like transformers' own check
    (``torch.cuda.is_available()``): a model left on the CPU of a GPU machine still gets correct answers,
    through the API's fallback. Multi-head latent attention (``kv_lora_rank`` in the config) is refused: its
    cache holds latents, and V a head dim of its own (module docstring)."""
    if getattr(config, "kv_lora_rank", None) is not None:
        return (f"multi-head latent attention (kv_lora_rank={config.kv_lora_rank}, v_head_dim="
                f"{getattr(config, 'v_head_dim', None)}): its cache holds latents and V has a head dim of its own")
    heads = getattr(config, "num_attention_heads", None)
    head_dim = getattr(config, "head_dim", None) or (config.hidden_size // heads if heads else None)
    if head_dim is not None and head_dim > MAX_HEAD_DIM:  # every call takes transformers' sdpa (attention_forward's)
        return f"head dim {head_dim} (the kernels take up to {MAX_HEAD_DIM})"
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return kernels_unavailable_reason(torch.empty(0, device=device))


def _block_table_plan(cu_k: torch.Tensor, table: torch.Tensor, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``seqlens`` int32 ``(B,)`` (keys per sequence, the new one included) and ``slots`` int64 ``(B,)``
    (where each new token goes in the flattened pool, -1 for a padding sequence: write nothing).

    The same for every layer of a step, so it is computed once per forward pass (a dozen tiny kernels
    per layer otherwise, as much GPU time as the attention itself at short lengths)."""
    seqlens = (cu_k[1:] - cu_k[:-1]).to(torch.int32)  # (B,)
    position = seqlens.long() - 1  # (B,) the new token's position; -1 for padding sequences (length 0)
    column = (position.clamp(min=0) // page_size).clamp(max=table.shape[1] - 1)  # (B,)
    page = table.gather(1, column[:, None])[:, 0].long()  # (B,)
    return seqlens, torch.where(position >= 0, page * page_size + position % page_size, -1)


def _refuse_what_the_pool_cannot_hold(module, query, key, value, k_pages, v_pages) -> None:
    """The block-table pools ``(num_pages, page_size, H_kv, D)`` hold K and V at one head dim: new rows
    ``(1, H_kv, B, D)`` of another shape, or a V head dim of its own, are refused by name."""
    pool = tuple(k_pages.shape[2:])  # (H_kv, D)
    fits = value.shape[-1] == query.shape[-1] and all(
        (t.shape[1], t.shape[-1]) == pool and tuple(p.shape[2:]) == pool for t, p in ((key, k_pages), (value, v_pages))
    )
    if not fits:
        from .attention import UnsupportedAttentionFeature

        raise UnsupportedAttentionFeature(
            f"hf_flashpatch's block-table route cannot serve {type(module).__name__}: its pools hold K/V rows of "
            f"(H_kv, D) = {pool} and {tuple(v_pages.shape[2:])}, got query {tuple(query.shape)}, key "
            f"{tuple(key.shape)} and value {tuple(value.shape)} (a value head dim of its own, or a latent cache, "
            "as in multi-head latent attention); run generate_batch with max_blocks_per_request=0"
        )


def block_table_attention(module, query, key, value, scaling, kwargs) -> tuple[torch.Tensor, None]:
    """The block-table form (module docstring). query ``(1, H, B, D)``: one new token per sequence."""
    k_pages, v_pages = kwargs["k_cache"], kwargs["v_cache"]  # (num_pages, page_size, H_kv, D)
    table = kwargs["block_table"]  # (B, max_pages) int32
    cu_k = _per_layer(kwargs["cu_seq_lens_k"], "full_attention")  # (B + 1,)
    batch, page_size = table.shape[0], k_pages.shape[1]
    if query.shape[0] != 1 or query.shape[2] != batch:
        raise ValueError(
            f"a block-table call carries one new token per sequence, got query {tuple(query.shape)} "
            f"(1, heads, tokens, head_dim) for a block_table of {batch} sequences"
        )
    _refuse_what_the_pool_cannot_hold(module, query, key, value, k_pages, v_pages)
    # The pool is in the model's dtype; what is written into it and read with it must match.
    dtype = k_pages.dtype
    q = query[0].transpose(0, 1).to(dtype)[:, None]  # (B, 1, H, D)
    k_new = key[0].transpose(0, 1).to(dtype)  # (B, H_kv, D)
    v_new = value[0].transpose(0, 1).to(dtype)

    seqlens, slots = once_per_forward(
        cu_k, ("block_table_plan", table.data_ptr(), tuple(table.shape), page_size), getattr(module, "layer_idx", None),
        lambda cu: _block_table_plan(cu, table, page_size),
    )  # fmt: skip
    # Slots address the pages flattened: .view (not reshape) so that a copy can never take the write.
    k_pool = k_pages.view(-1, *k_pages.shape[2:])  # (num_pages * page_size, H_kv, D)
    v_pool = v_pages.view(-1, *v_pages.shape[2:])
    api.kv_append(k_new, v_new, k_pool, v_pool, slots, check_inputs=False)

    out = api.flash_attn_paged_decode(
        q, k_pages, v_pages, table, seqlens, causal=True, softmax_scale=scaling,
        window=_window(kwargs.get("sliding_window")), softcap=kwargs.get("softcap"), check_inputs=False,
        sinks=unsupported.sink_logits(kwargs),  # GPT-OSS's s_aux: folded into the decode's (out, lse)
    )  # fmt: skip  (B, 1, H, D)
    return out.reshape(1, batch, *out.shape[2:]), None  # (1, B, H, D)
