"""The attention function registered with transformers' ``AttentionInterface``.

transformers calls ``fn(module, query, key, value, attention_mask, dropout=, scaling=, **kwargs)`` with
query ``(B, H, S_q, D)``, key ``(B, H_kv, S_k, D)`` and value ``(B, H_kv, S_k, D_v)`` (RoPE applied, cache
concatenated; ``D_v`` differs from ``D`` in multi-head latent attention, DeepSeek-V2/V3). We hand
``.transpose(1, 2)`` views, i.e. the project layout ``(batch, seqlen, heads, head_dim)``, to the public API
(no copies: the kernels take strides) and return ``(out (B, S_q, H, D_v) contiguous, None)``. A ``D_v != D``
call runs where any other would (:mod:`hf_flashpatch.kernels.value_head_dim`), except an eager decode step on
a device with the kernels in a pair no decode kernel is built for (192/128 is), which takes transformers' sdpa
(:mod:`.unsupported`, reason ``value head dim``).

The mask arrives from :func:`transformers.masking_utils.flash_attention_mask` (see :mod:`.masks`): ``None``
for plain causal attention, else a 2-D ``(B, S_mask)`` bool key-padding mask (True = real token). Which
path runs:

- ``cu_seq_lens_q/k`` + ``max_length_q/k`` in kwargs (``DataCollatorWithFlattening``, continuous
  batching): the sequences are packed along the batch-1 row; varlen over them;
- a padding mask: unpad the real tokens into varlen (left padding assumed for queries, as in transformers'
  flash_attention_2 integration), pad the output back (padded query rows get zeros);
- ``position_ids`` that restart within a batch-1 row (packed sequences without ``cu_seq_lens``): varlen
  with the sequence starts read off the restarts;
- otherwise: one query token over a cache -> ``flash_attn_with_kvcache`` (the split-KV decode kernel),
  several -> ``flash_attn_func``. Causal masks are bottom-right aligned when ``S_q < S_k``.

``sliding_window=W`` (Mistral, Qwen2) is the window ``(W - 1, 0)``, and ``(W - 1, W - 1)`` in a non-causal call
(ModernBERT, bidirectional Gemma 3); ``softcap`` (Gemma 2) passes through. A non-causal call whose queries are
fewer or more than its mask's columns is cross-attention (decoder queries over an encoder's keys and mask):
every query row is computed, and only the keys are unpadded.
Head counts come from the tensor shapes, never from the config.

Not supported, with a clear error rather than a wrong answer: ``output_attentions=True`` (we never build
the probabilities; use ``attn_implementation="eager"``), attention dropout > 0 (training with
``attention_dropout``; set it to 0 or use ``sdpa``/``eager``). Attention sinks (``s_aux``, GPT-OSS: one
logit per query head) run on the kernels, folded into their ``(out, lse)`` (:mod:`hf_flashpatch.sinks`).

Dtypes: when q/k/v disagree (autocast or PEFT with fp32 layer norms), everything is cast to the autocast
dtype if autocast is on, else to the half dtype among them (what the flash_attention_2 integration does).
fp32 models run too; the public API serves fp32 with its torch fallback (the CUDA kernels are fp16/bf16).
"""

from __future__ import annotations

import threading
from typing import NamedTuple

import torch

from .. import api  # called as api.<fn> so that a monkeypatched function is seen (tests count calls)
from ..validate import check_scalars
from . import unsupported  # called as unsupported.<fn> so that a monkeypatched function is seen (tests count calls)
from .traced import traced_attention


class UnsupportedAttentionFeature(NotImplementedError):
    """A transformers feature that this backend does not implement (it names an alternative)."""


def check_unsupported(module, dropout: float, kwargs: dict) -> None:
    """Refuse what would otherwise give a silently wrong answer. (Attention sinks are served on every route.)"""
    if kwargs.get("output_attentions", False):
        raise UnsupportedAttentionFeature(
            "hf_flashpatch's attention backend does not return attention probabilities (output_attentions=True); "
            "load or switch the model with attn_implementation='eager' for that"
        )
    if dropout and dropout > 0.0:
        raise UnsupportedAttentionFeature(
            f"hf_flashpatch's attention backend has no attention dropout, got dropout={dropout} "
            f"(module {type(module).__name__} in training mode); load the model with its attention dropout at 0 "
            "(e.g. from_pretrained(path, attention_dropout=0.0), attn_pdrop for GPT-2: the modules read it when "
            "they are built), call model.eval(), or train with attn_implementation='sdpa'"
        )


def common_dtype(module, *tensors: torch.Tensor) -> torch.dtype:
    """The dtype q, k, v are computed in (see the module docstring)."""
    dtypes = {t.dtype for t in tensors}
    device_type = tensors[0].device.type
    autocast = device_type in ("cpu", "cuda", "xpu", "mps", "hpu") and torch.is_autocast_enabled(device_type)
    if autocast and torch.float32 in dtypes:  # (autocast knows no other device, the meta device included)
        return torch.get_autocast_dtype(device_type)
    if len(dtypes) == 1:
        return tensors[0].dtype
    for t in tensors[::-1]:  # v first: it comes straight out of v_proj, so it carries the weights' dtype
        if t.dtype in (torch.float16, torch.bfloat16):
            return t.dtype
    return torch.float32


def window_from_sliding(sliding_window, causal: bool = True) -> tuple[int, int] | None:
    """transformers' ``sliding_window=W`` lets each query see itself and the ``W - 1`` keys before it; without
    causality, the ``W - 1`` keys on either side (transformers' flash integration; ModernBERT passes
    ``W = config.sliding_window + 1``, Gemma 3's bidirectional layers ``W`` with a mask of distance ``< W``)."""
    if sliding_window is None or sliding_window <= 0:
        return None
    return (int(sliding_window) - 1, 0 if causal else int(sliding_window) - 1)


# Model types whose mask slides every layer while their attention call carries no ``sliding_window``
# (PhiMoE builds a sliding mask from ``config.sliding_window``). A config field alone does not say it:
# Moshi has ``sliding_window`` in its config and attends causally. The coverage matrix
# (tests/test_architectures.py) finds a new such model as a failing row.
WINDOW_ONLY_IN_MASK = frozenset({"phimoe"})


def window_of_every_layer(module) -> int | None:
    """The sliding window a model applies in its mask without passing it to the attention call."""
    config = getattr(module, "config", None)
    if getattr(config, "model_type", None) not in WINDOW_ONLY_IN_MASK:
        return None
    return getattr(config, "sliding_window", None)


def layer_sliding_window(module, kwargs: dict) -> int | None:
    """A continuous-batching call's sliding window: the call's ``sliding_window`` where the call passes one (None
    there is a full layer: EXAONE 4 keeps the config's window on every layer's module and passes it only to its
    sliding layers), else the module's (Mistral-like models on transformers 5.17 pass none), else the one its model
    applies only in the mask."""
    passed = kwargs["sliding_window"] if "sliding_window" in kwargs else getattr(module, "sliding_window", None)
    return passed or window_of_every_layer(module)


def _as_int(x) -> int:
    return int(x.item()) if isinstance(x, torch.Tensor) else int(x)


def varlen_packed_row(q, k, v, cu_q, cu_k, max_q, max_k, check_inputs=False, **attn):
    """Sequences packed along one batch row. q ``(1, T_q, H, D)``, k/v ``(1, T_k, H_kv, D)``."""
    if q.shape[0] != 1:
        raise ValueError(
            f"cu_seq_lens_q/k describe sequences packed in a batch of 1, got query of shape {tuple(q.shape)} "
            "(batch, seqlen, heads, head_dim)"
        )
    out = api.flash_attn_varlen_func(
        q[0], k[0], v[0],  # (T, H, D) views
        cu_q, cu_k, _as_int(max_q), _as_int(max_k), check_inputs=check_inputs,  # int64 tables checked before a cast
        **attn,
    )  # fmt: skip
    return out[None]  # (1, T_q, H, D)


def cu_seqlens_from_position_ids(position_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Sequence starts of a packed batch-1 row: every place the position restarts at its minimum."""
    flat = position_ids.reshape(-1)
    is_start = flat == flat.min()
    is_start[0] = True  # a row that opens mid-document ([5, 6, 7, 0, 1, ...]) still starts a sequence at 0
    starts = is_start.nonzero().view(-1).to(torch.int32)  # (num_seqs,)
    cu = torch.cat([starts, starts.new_tensor([flat.numel()])])  # (num_seqs + 1,)
    return cu, int(cu.diff().max())


def is_packed_row(position_ids, batch: int, seqlen_q: int, seqlen_k: int) -> bool:
    """True when a batch-1 row without a cache holds several sequences (positions restart)."""
    if position_ids is None or batch != 1 or seqlen_q == 1 or seqlen_q != seqlen_k:
        return False
    if position_ids.dim() > 2 or position_ids.shape[-1] != seqlen_q:  # e.g. 3-D multimodal RoPE positions
        return False
    flat = position_ids.reshape(-1)
    return bool((flat.diff() != 1).any())


class _UnpadPlan(NamedTuple):
    """Where the real tokens of a padded batch are: flat row indices, cu_seqlens and longest length."""

    rows_q: tuple[torch.Tensor, torch.Tensor]  # (batch index, position) of each real query, (T_q,) each
    cu_q: torch.Tensor  # (B + 1,) int32
    max_q: int
    rows_k: tuple[torch.Tensor, torch.Tensor]  # the same for the keys, positions in 0..S_mask-1
    cu_k: torch.Tensor
    max_k: int


_host_facts = threading.local()  # answers about a mask / position tensor that cost a host sync


def once_per_forward(tensor: torch.Tensor, tag, layer_idx, compute):
    """``compute(tensor)``, evaluated once per forward pass of a model rather than once per layer.

    Every layer of a forward receives the same mask and position tensors, and each answer (``bool(...)``,
    ``int(...)`` of a device value, an unpadding plan) costs a host sync, which would otherwise stall the
    GPU once per layer. An answer is reused while the same tensor object (and, outside
    ``torch.inference_mode``, the same in-place version) reaches layers of increasing ``layer_idx``; a
    layer index that does not increase starts a new forward pass (or a checkpointed recomputation), and a
    module without a ``layer_idx`` always recomputes. Inference tensors have no version counter, so the
    layer order is what keeps an answer from outliving its forward pass. Per thread (continuous batching
    runs the model in a background thread); the cache holds the tensor itself, so its identity cannot be
    reused by another tensor.
    """
    version = None if tensor.is_inference() else tensor._version
    cache = getattr(_host_facts, "entries", None)
    if cache is None:
        cache = _host_facts.entries = {}
    key = (tag, id(tensor))
    hit = cache.get(key)
    if (
        hit is not None and layer_idx is not None and hit[0] is tensor and hit[1] == version
        and hit[2] is not None and layer_idx > hit[2]
    ):  # fmt: skip
        del cache[key]  # re-inserted last: the dict's order is least recently used first
        cache[key] = (tensor, version, layer_idx, hit[3])
        return hit[3]
    value = compute(tensor)
    cache.pop(key, None)
    while len(cache) >= 8:  # a forward uses a few tensors; older ones must not be kept alive
        del cache[next(iter(cache))]
    cache[key] = (tensor, version, layer_idx, value)
    return value


def _written_slots(mask: torch.Tensor) -> int:
    """One past the last True column of a ``(B, S)`` mask (a static buffer's written slots)."""
    columns = torch.arange(1, mask.shape[1] + 1, device=mask.device)
    return int(torch.where(mask.bool(), columns, 0).amax())


def unpad_plan(key_mask: torch.Tensor, seqlen_q: int, device, layer_idx=None, queries_follow_keys=True) -> _UnpadPlan:
    """The plan for ``key_mask`` ``(B, S_mask)``, computed once per forward rather than once per layer
    (it costs host syncs; see :func:`once_per_forward`). ``queries_follow_keys`` (as :func:`unpadded_attention`)."""
    queries_are_keys = queries_follow_keys or seqlen_q == key_mask.shape[1]
    return once_per_forward(key_mask, ("plan", seqlen_q, device, queries_are_keys), layer_idx,
                            lambda m: _make_plan(m, seqlen_q, device, queries_are_keys))  # fmt: skip


def _make_plan(key_mask: torch.Tensor, seqlen_q: int, device, queries_are_keys: bool) -> _UnpadPlan:
    bool_mask = key_mask.to(device=device, dtype=torch.bool)
    lens_k = bool_mask.sum(dim=1, dtype=torch.int32)  # (B,)
    if queries_are_keys:
        query_mask = bool_mask[:, -seqlen_q:]  # (B, S_q): left padding puts the queries in the last columns
    else:  # cross-attention: the mask is the keys' (the encoder's); every query row is computed
        query_mask = torch.ones(bool_mask.shape[0], seqlen_q, dtype=torch.bool, device=device)
    lens_q = query_mask.sum(dim=1, dtype=torch.int32)
    return _UnpadPlan(
        rows_q=tuple(query_mask.nonzero().unbind(1)),
        cu_q=torch.nn.functional.pad(lens_q.cumsum(0, dtype=torch.int32), (1, 0)),
        max_q=int(lens_q.max()),
        rows_k=tuple(bool_mask.nonzero().unbind(1)),
        cu_k=torch.nn.functional.pad(lens_k.cumsum(0, dtype=torch.int32), (1, 0)),
        max_k=int(lens_k.max()),
    )


def unpadded_attention(q, k, v, key_mask: torch.Tensor, layer_idx=None, queries_follow_keys=True, **attn):
    """Key-padding mask ``(B, S_mask)`` (True = real token): unpad into varlen, pad the output back.

    Keys beyond ``S_mask`` (the unwritten tail of a StaticCache) are dropped. Queries are the last ``S_q``
    mask columns (left padding, as transformers' flash integration assumes); padded query rows get zeros.
    ``queries_follow_keys=False`` (non-causal calls): where ``S_q`` differs from ``S_mask`` the queries are not
    the keys' tokens (cross-attention: decoder queries, an encoder's mask), and every query row is computed.
    """
    batch, seqlen_q = q.shape[0], q.shape[1]
    seqlen_mask = key_mask.shape[1]
    if k.shape[1] < seqlen_mask:
        raise ValueError(
            f"attention mask covers {seqlen_mask} keys but the keys have {k.shape[1]} "
            f"(k shape {tuple(k.shape)}, (batch, seqlen, heads, head_dim))"
        )
    plan = unpad_plan(key_mask, seqlen_q, q.device, layer_idx, queries_follow_keys)
    # Gathered straight from the strided views: no contiguous copy of the whole cache first.
    k_packed, v_packed = k[plan.rows_k], v[plan.rows_k]  # (T_k, H_kv, D)
    q_packed = q[plan.rows_q]  # (T_q, H, D)
    out_packed = api.flash_attn_varlen_func(
        q_packed, k_packed, v_packed, plan.cu_q, plan.cu_k, plan.max_q, plan.max_k, check_inputs=False, **attn
    )  # (T_q, H, D): the plan's tables are ours
    out = out_packed.new_zeros(batch, seqlen_q, *out_packed.shape[1:])  # (B, S_q, H, D)
    return out.index_put(plan.rows_q, out_packed)  # padded query rows stay 0


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      sliding_window: int | None = None, softcap: float | None = None, is_causal: bool | None = None,
                      **kwargs) -> tuple[torch.Tensor, None]:  # fmt: skip  (transformers' attention signature)
    """query ``(B, H, S_q, D)``, key ``(B, H_kv, S_k, D)``, value ``(B, H_kv, S_k, D_v)`` ->
    ``(out (B, S_q, H, D_v) contiguous, None)``."""
    reason = unsupported.fallback_reason(query, key, value, attention_mask, kwargs)
    if reason is not None:  # sinks of another shape, a V head dim of its own in a decode step on the kernels' device,
        # ...: transformers' sdpa/eager, one warning per reason
        return unsupported.fallback_attention(module, query, key, value, attention_mask, dropout=dropout,
                                              scaling=scaling, sliding_window=sliding_window, softcap=softcap,
                                              is_causal=is_causal, reason=reason, **kwargs)  # fmt: skip
    if sliding_window is None:
        sliding_window = window_of_every_layer(module)
    check_unsupported(module, dropout, kwargs)
    for label, t in (("query", query), ("key", key), ("value", value)):
        if t.dim() != 4:
            raise ValueError(f"{label} must be 4-D (batch, heads, seqlen, head_dim), got {tuple(t.shape)}")
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(
            f"hf_flashpatch's attention backend expects a 2-D key-padding mask (batch, seqlen) from its registered "
            f"mask function, got shape {tuple(attention_mask.shape)}; a 4-D mask means the model built it "
            "itself, which this backend cannot honour (use 'sdpa' for such a model)"
        )
    if attention_mask is not None and attention_mask.shape[0] != query.shape[0]:
        raise ValueError(
            f"the attention mask has {attention_mask.shape[0]} rows (shape {tuple(attention_mask.shape)}, (batch, "
            f"seqlen)) but the batch has {query.shape[0]} (query shape {tuple(query.shape)}, (batch, heads, seqlen, "
            "head_dim)); pass one mask row per sequence"
        )
    dtype = common_dtype(module, query, key, value)
    # (B, S_q, H, D) and (B, S_k, H_kv, D) views; a cast only where needed (every op costs host time per layer)
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    if not (q.dtype == k.dtype == v.dtype == dtype):
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    attn = dict(causal=bool(causal), softmax_scale=scaling, window=window_from_sliding(sliding_window, bool(causal)),
                softcap=softcap, sinks=unsupported.sink_logits(kwargs))  # fmt: skip

    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
    position_ids = kwargs.get("position_ids")
    if torch.compiler.is_compiling():
        attn["softcap"] = check_scalars(scaling, softcap, attn["window"])  # host-only: softcap=inf means none
        differentiable = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        packed = (cu_q, cu_k, max_q, max_k) if cu_q is not None and cu_k is not None else None
        out = traced_attention(q, k, v, attention_mask, position_ids, packed, attn, differentiable)
        return out.contiguous(), None
    layer = getattr(module, "layer_idx", None)
    if attention_mask is not None:
        static_buffer = attn["causal"] and attention_mask.shape[1] == k.shape[1] and q.shape[1] < k.shape[1]
        if static_buffer:  # its mask covers every slot, False past the written ones; keep the written part, as
            # transformers' own mask has it (a non-causal call with fewer queries is cross-attention: no cache slots)
            written = once_per_forward(attention_mask, "written", layer, _written_slots)
            attention_mask = attention_mask[:, :written]
        if attention_mask.shape[1] < k.shape[1]:  # keys past the mask are not written yet
            k, v = k[:, : attention_mask.shape[1]], v[:, : attention_mask.shape[1]]  # (B, S_mask, H_kv, D)
        if once_per_forward(attention_mask, "all-real", layer, lambda m: bool(m.all())):
            attention_mask = None
    batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
    differentiable = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if cu_q is not None and cu_k is not None and max_q is not None and max_k is not None and attention_mask is None:
        first_use = []  # the caller's tables: their contents are checked once per forward, not per layer
        once_per_forward(cu_q, ("tables checked", id(cu_k)), layer, lambda _: first_use.append(True))
        out = varlen_packed_row(q, k, v, cu_q, cu_k, max_q, max_k, check_inputs=bool(first_use), **attn)
    elif attention_mask is not None:
        out = unpadded_attention(q, k, v, attention_mask, layer, queries_follow_keys=attn["causal"], **attn)
    elif position_ids is not None and batch == 1 and 1 < seqlen_q == seqlen_k and once_per_forward(
        position_ids, ("packed", batch, seqlen_q, seqlen_k), layer,
        lambda p: is_packed_row(p, batch, seqlen_q, seqlen_k),
    ):
        cu, max_len = once_per_forward(
            position_ids, ("cu", q.device), layer, lambda p: cu_seqlens_from_position_ids(p.to(q.device))
        )
        out = varlen_packed_row(q, k, v, cu, cu, max_len, max_len, **attn)
    elif seqlen_q == 1 and seqlen_k > 1 and attn["causal"] and not differentiable:
        out = api.flash_attn_with_kvcache(q, k, v, **attn)  # one new token over the whole cache (decode kernel)
    else:
        out = api.flash_attn_func(q, k, v, **attn)
    return out.contiguous(), None
