"""The fallback for attention calls our kernels cannot serve: transformers' own sdpa or eager attention.

Some architectures ask for attention the kernels do not compute. Rather than give a wrong answer (or
refuse the model), :func:`attention_forward <hf_flashpatch.backend.attention.attention_forward>` asks
:func:`fallback_reason` first and, when it names a reason, hands the call to :func:`fallback_attention`,
which warns once per reason and runs what the model would run under ``attn_implementation="sdpa"`` or
``"eager"``. The reasons, in the order they are checked:

- ``attention sinks``: ``s_aux`` / ``sinks`` of a shape other than one logit per query head ``(H,)``
  (the kernel path serves those: :mod:`hf_flashpatch.sinks`). -> the model's own
  ``eager_attention_forward``, which reads them.
- ``unknown keyword``: a keyword with a value that the kernels neither implement nor know to be
  bookkeeping (e.g. the ``indices`` of DeepSeek sparse attention). Ignoring it could change the answer.
  -> the model's own eager function, which defines what the keyword means.
- ``position bias``: an additive ``(B, H, S_q, S_k)`` score bias (Inkling). -> sdpa, which adds it.
- ``head dim``: a Q/K (or V) head dim above the kernels' limit (Gemma 4's 512-wide global layers). -> sdpa.
- ``value head dim``: an eager decode step (at most ``DECODE_MAX_QUERIES`` new tokens over a longer cache,
  no gradients) whose V head dim differs from Q/K's in a pair no decode kernel is built for, on a device
  where the kernels run. -> sdpa, which takes any V head dim. The decode kernels take q/k 192 with v 128
  (DeepSeek-V2/V3's multi-head latent attention; ``DecodeConfig.served``); everything else such a model
  runs (prefill, training, chunked prefill) is served on the kernels for any pair
  (:mod:`hf_flashpatch.kernels.value_head_dim`); a decode step of another pair is not, because padding the
  whole cache at every step would cost more than the attention. On CPU the API's torch path serves it
  directly, and under ``torch.compile`` :mod:`.traced` calls the decode op, whose exact torch path serves
  such a pair, so neither comes here.
- ``4-D mask``: a mask the caller or the model built itself; ours is ``None`` or 2-D. -> sdpa, as is.

sdpa cannot apply a softcap or sinks, so those always go to eager; dropout passes through. Both take the
mask as transformers builds it for them, a 4-D ``(B, 1, S_q, S_k)`` mask (bool for sdpa, additive for
eager); :func:`dense_mask` builds it from what our registered mask function gives (see :mod:`.masks`):
``None`` or a 2-D ``(B, S_mask)`` key-padding mask, and from ``cu_seq_lens_q/k`` (continuous batching,
packed sequences) or restarting ``position_ids`` (packed sequences without them). Causal masks are
bottom-right aligned (the queries are the last written keys), with ``sliding_window=W`` as transformers
defines it (a query sees itself and the ``W - 1`` keys before it). Query rows that see no key (left
padding) come back as zeros, as on the kernel path.
"""

from __future__ import annotations

import importlib
import sys
import warnings

import torch

from ..kernels import kernels_unavailable_reason
from ..kernels.decode_config import DecodeConfig
from ..validate import MAX_HEAD_DIM
from .traced import DECODE_MAX_QUERIES

# Keywords that do not change what attention computes, or that the kernel path implements: what the backend
# reads, per-call bookkeeping and continuous batching's (transformers' own lists of those are added at use).
_KNOWN_KWARGS = frozenset({
    "sliding_window", "softcap", "is_causal", "dropout", "scaling", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k",
    "max_length_q", "max_length_k", "max_seqlen_q", "max_seqlen_k", "cache", "read_index", "write_index",
    "block_table", "logits_indices", "logits_processor_args", "output_attentions", "output_hidden_states",
    "output_router_logits", "num_items_in_batch", "seq_idx", "use_cache", "cache_position", "past_key_values",
    "layer_idx",
})  # fmt: skip
_SINK_KWARGS = ("s_aux", "sinks")
_SDPA_HANDLES = frozenset({"position_bias"})  # keywords transformers' sdpa function applies

SINKS = "attention sinks"
UNKNOWN_KWARG = "unknown keyword"
POSITION_BIAS = "position bias"
VALUE_HEAD_DIM = "value head dim"
HEAD_DIM = "head dim"
MASK_4D = "4-D mask"

_warned: set[str] = set()


def _transformers_kwargs() -> frozenset[str]:
    """transformers' own per-call kwargs (TransformersKwargs) and continuous batching's (PagedAttentionArgs), so
    that bookkeeping a newer transformers adds there is known without a change here. Read once, at import:
    ``torch.compile`` cannot trace imports."""
    names: set[str] = set()
    for module, name in (
        ("transformers.utils.generic", "TransformersKwargs"),
        ("transformers.generation.continuous_batching.input_outputs", "PagedAttentionArgs"),
    ):
        try:
            names |= set(getattr(importlib.import_module(module), name).__annotations__)
        except (ImportError, AttributeError):  # no transformers, or one without that list
            pass
    return frozenset(names - {"attention_mask", "input_ids"})


_KNOWN = _KNOWN_KWARGS | _transformers_kwargs()


_ANY_KNOWN = _KNOWN | frozenset(_SINK_KWARGS) | _SDPA_HANDLES


def _unknown_kwargs(kwargs: dict) -> list[str]:
    """Keywords carrying a value that the kernel path would ignore without knowing what they mean."""
    if kwargs.keys() <= _ANY_KNOWN:  # every layer of every decode step asks: a set comparison, no loop
        return []
    return sorted(
        name for name, value in kwargs.items()
        if name not in _KNOWN and name not in _SINK_KWARGS and name not in _SDPA_HANDLES
        and value is not None and value is not False
    )  # fmt: skip


def sink_logits(kwargs: dict) -> torch.Tensor | None:
    """The attention sinks a model passes (``s_aux``, GPT-OSS; or ``sinks``), or None."""
    for name in _SINK_KWARGS:
        if kwargs.get(name) is not None:
            return kwargs[name]
    return None


def fallback_reason(query, key, value, attention_mask, kwargs: dict) -> str | None:
    """The reason (one of the module constants) the kernels cannot serve this call, or None if they can.

    query ``(B, H, S_q, D)``, key/value ``(B, H_kv, S_k, D | D_v)`` as transformers passes them; ``kwargs``
    is what the attention function received besides them.
    """
    sinks = sink_logits(kwargs)
    if sinks is not None and (tuple(sinks.shape) != (query.shape[1],) or not sinks.is_floating_point()):
        return SINKS
    if _unknown_kwargs(kwargs):
        return UNKNOWN_KWARG
    if kwargs.get("position_bias") is not None:
        return POSITION_BIAS
    if max(query.shape[-1], value.shape[-1]) > MAX_HEAD_DIM:
        return HEAD_DIM
    own_value_dim = value.shape[-1] != query.shape[-1] and not DecodeConfig.served(query.shape[-1], value.shape[-1])
    if own_value_dim and decode_step_on_kernels(query, key, value):
        return VALUE_HEAD_DIM
    if attention_mask is not None and attention_mask.dim() == 4:
        return MASK_4D
    return None


def decode_step_on_kernels(query, key, value) -> bool:
    """An eager decode step (at most ``DECODE_MAX_QUERIES`` query tokens over more keys, no gradients) on a
    device where the kernels run. query ``(B, H, S_q, D)``, key/value ``(B, H_kv, S_k, D | D_v)``. Never under
    ``torch.compile``: the traced path decides there (and the kernels' availability is a host question)."""
    if torch.compiler.is_compiling():
        return False
    differentiable = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    decode = query.shape[2] <= DECODE_MAX_QUERIES and key.shape[2] > query.shape[2] and not differentiable
    return decode and kernels_unavailable_reason(query) is None


def _detail(reason: str, query, value, attention_mask, kwargs) -> str:
    """What was received, for the warning."""
    if reason == SINKS:
        name = next(name for name in _SINK_KWARGS if kwargs.get(name) is not None)
        return f"{name} of shape {tuple(kwargs[name].shape)}"
    if reason == UNKNOWN_KWARG:
        return f"got {', '.join(_unknown_kwargs(kwargs))}"
    if reason == POSITION_BIAS:
        return f"position_bias of shape {tuple(kwargs['position_bias'].shape)}"
    if reason == VALUE_HEAD_DIM:
        return (f"value head dim {value.shape[-1]}, query/key head dim {query.shape[-1]}, in a decode step: the "
                "decode kernels take q/k and v of one head dim, or 192 and 128")  # fmt: skip
    if reason == HEAD_DIM:
        return f"got {query.shape[-1]} (value {value.shape[-1]}), the kernels take up to {MAX_HEAD_DIM}"
    if reason == MASK_4D:
        return f"mask of shape {tuple(attention_mask.shape)}"
    return reason


def warn_once(reason: str, message: str) -> None:
    """One warning per reason per process. Not while ``torch.compile`` traces (it cannot trace a warning); the
    eager calls around a compiled region (``generate``'s prefill) give it."""
    if not torch.compiler.is_compiling() and reason not in _warned:
        _warned.add(reason)
        warnings.warn(message, stacklevel=4)


def fallback_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                       sliding_window: int | None = None, softcap: float | None = None, is_causal: bool | None = None,
                       reason: str | None = None, **kwargs) -> tuple[torch.Tensor, None]:  # fmt: skip
    """query ``(B, H, S_q, D)``, key/value ``(B, H_kv, S_k, D | D_v)`` -> ``(out (B, S_q, H, D_v), None)``.

    Runs transformers' ``sdpa_attention_forward``, or the model's own ``eager_attention_forward`` for
    sinks, softcap and unknown keywords, on the 4-D mask :func:`dense_mask` builds; warns once per reason.
    """
    everything = dict(kwargs, softcap=softcap, sliding_window=sliding_window)
    reason = reason or fallback_reason(query, key, value, attention_mask, everything) or "requested"
    sinks = any(kwargs.get(name) is not None for name in _SINK_KWARGS)
    use_eager = softcap is not None or sinks or bool(_unknown_kwargs(kwargs))  # what sdpa cannot do
    attend = _eager_function(module, reason) if use_eager else _sdpa_function()
    warn_once(
        reason,
        f"hf_flashpatch: the attention kernels cannot serve {type(module).__name__} ({reason}: "
        f"{_detail(reason, query, value, attention_mask, everything)}); running transformers' "
        f"{'eager' if use_eager else 'sdpa'} attention for it instead (slower, same answer)",
    )
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    has_key = None  # (B, 1, S_q, 1): rows that see at least one key, None = all of them
    if attention_mask is not None and attention_mask.dim() == 4:  # built by the caller or the model: as it is
        visible = attention_mask
    else:
        visible = dense_mask(query, key, attention_mask, causal, sliding_window, kwargs)  # (B, 1, S_q, S_k) or None
        if visible is not None:
            has_key = visible.any(dim=-1, keepdim=True)
            visible = visible | ~has_key  # a row that sees nothing would be NaN: it sees all, then gets zeros
    mask = visible
    if use_eager and visible is not None and visible.dtype == torch.bool:  # eager adds its mask to the scores
        mask = _additive(visible, query.dtype)
    if softcap is not None:
        kwargs["softcap"] = softcap
    # is_causal=False: the mask says it all (sdpa's own causal flag is top-left aligned)
    out, _ = attend(module, query, key, value, mask, dropout=dropout, scaling=scaling, is_causal=False, **kwargs)
    if has_key is not None:
        out = out.masked_fill(~has_key.view(has_key.shape[0], -1, 1, 1), 0.0)  # (B, S_q, H, D_v)
    return out.contiguous(), None


def _sdpa_function():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward


def _eager_function(module: torch.nn.Module, reason: str):
    """The ``eager_attention_forward`` of the module's own modeling file: what ``attn_implementation="eager"``
    runs for this model, so it implements every keyword the model passes (sinks, softcap, ...)."""
    eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if eager is None:
        from .attention import UnsupportedAttentionFeature

        raise UnsupportedAttentionFeature(
            f"hf_flashpatch's attention kernels cannot serve {type(module).__name__} ({reason}) and its module "
            f"{type(module).__module__} has no eager_attention_forward to fall back on; load the model with "
            "attn_implementation='eager'"
        )
    return eager


def _additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool mask (True = attend) -> the additive float mask eager attention adds to the scores."""
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, torch.finfo(dtype).min)


def dense_mask(query, key, attention_mask, causal: bool, sliding_window, kwargs: dict) -> torch.Tensor | None:
    """The bool ``(B, 1, S_q, S_k)`` mask (True = attend) that our mask format stands for; None = all visible.

    Each query and key gets a sequence id and a position within its sequence; a query sees the keys of its
    own sequence up to its position (causal, bottom-right aligned), not ``sliding_window`` or more behind.
    Tensor ops only: no host sync.
    """
    batch, seqlen_q, seqlen_k, device = query.shape[0], query.shape[2], key.shape[2], query.device
    q_index = torch.arange(seqlen_q, device=device)  # (S_q,)
    k_index = torch.arange(seqlen_k, device=device)  # (S_k,)
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    position_ids = kwargs.get("position_ids")
    key_real = None  # (B, S_k) bool, None = every key is real
    if attention_mask is None and cu_q is not None and cu_k is not None:  # sequences packed along one batch row
        cu_q, cu_k = cu_q.to(device=device, dtype=torch.long), cu_k.to(device=device, dtype=torch.long)
        q_seq = torch.searchsorted(cu_q[1:], q_index, right=True)  # (S_q,); rows past cu_q[-1] get num_seqs
        k_seq = torch.searchsorted(cu_k[1:], k_index, right=True)  # (S_k,)
        lens_q, lens_k = cu_q.diff(), cu_k.diff()  # (num_seqs,)
        last = lens_q.numel() - 1
        # a query's position in its sequence's keys: its offset in the sequence plus the cached keys before it
        q_pos = q_index - cu_q[q_seq.clamp(max=last)] + (lens_k - lens_q)[q_seq.clamp(max=last)]  # (S_q,)
        k_pos = k_index - cu_k[k_seq.clamp(max=last)]  # (S_k,)
        same = (q_seq[:, None] == k_seq[None, :]) & (q_seq[:, None] <= last)  # (S_q, S_k)
    elif attention_mask is None and _packed_row(position_ids, batch, seqlen_q, seqlen_k):
        flat = position_ids.reshape(-1).to(device)  # (S,)
        starts = torch.ones_like(flat, dtype=torch.bool)
        starts[1:] = flat.diff() != 1  # transformers' rule (find_packed_sequence_indices)
        seq = starts.long().cumsum(0)  # (S,)
        q_pos, k_pos = q_index, k_index
        same = seq[:, None] == seq[None, :]  # (S, S)
    else:
        end = seqlen_k  # one past the last written key; the queries are the keys just before it
        if attention_mask is not None:
            key_real = attention_mask.to(device=device, dtype=torch.bool)
            if key_real.shape[1] > seqlen_k:
                raise ValueError(
                    f"attention mask covers {key_real.shape[1]} keys but the keys have {seqlen_k} "
                    f"(mask shape {tuple(key_real.shape)}, key shape {tuple(key.shape)})"
                )
            if causal and key_real.shape[1] == seqlen_k and seqlen_q < seqlen_k:  # a static buffer: False past
                end = torch.where(key_real, k_index + 1, 0).amax()  # the written slots: queries end at the last True
            else:
                end = key_real.shape[1]  # keys past the mask are not written yet
                key_real = torch.nn.functional.pad(key_real, (0, seqlen_k - key_real.shape[1]), value=False)
        elif not causal and not sliding_window:
            return None
        q_pos, k_pos = q_index + (end - seqlen_q), k_index  # (S_q,), (S_k,)
        same = None
    behind = q_pos[:, None] - k_pos[None, :]  # (S_q, S_k): how far each key lies behind each query
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device) if same is None else same
    if causal:
        visible = visible & (behind >= 0)
        if sliding_window:
            visible = visible & (behind < sliding_window)
    elif sliding_window:  # a bidirectional window: the W - 1 keys on either side (attention.window_from_sliding)
        visible = visible & (behind.abs() < sliding_window)
    visible = visible[None, None].expand(batch, 1, seqlen_q, seqlen_k)  # (B, 1, S_q, S_k)
    if key_real is not None:
        visible = visible & key_real[:, None, None, :]
    return visible


def _packed_row(position_ids, batch: int, seqlen_q: int, seqlen_k: int) -> bool:
    """A batch-1 row without a cache whose ``position_ids`` may restart (several packed sequences).

    Decided from shapes only; a row whose positions never restart gives one sequence, the plain case.
    """
    return (
        position_ids is not None and batch == 1 and seqlen_q == seqlen_k > 1 and position_ids.dim() <= 2
        and position_ids.shape[-1] == seqlen_q and position_ids.numel() == seqlen_q
    )  # fmt: skip
