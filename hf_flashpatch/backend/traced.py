"""The attention function's path under ``torch.compile``: every decision from shapes and flags.

Inside a compiled region nothing may read a tensor's values on the host (no ``bool(mask.all())``, no
``nonzero``), so the eager path's padding plan (:mod:`.attention`) is not available. Here every kernel
call is a custom op with a fake implementation whose torch fallback is chosen inside the op, and the
remaining data-dependent choices are made on the device. Layout: the project's ``(B, S, H, D)`` views.

What runs (the mask comes from :func:`.masks.key_padding_mask`, which under compile returns either
``None`` or a fixed-shape ``(B, S_k)`` key mask covering every key slot, True = a real, written token):

- ``cu_seq_lens_q/k`` (packed rows): the varlen kernel; ``max_length_q/k`` given as tensors are replaced
  by the static token counts (they only size the grid);
- no mask: the batched kernel (one new query token over a cache: the decode kernel). A batch-1 row with
  ``position_ids`` may hold several packed sequences: :mod:`.masked_op`'s op reads at run time whether it
  does, and runs the batched kernel or the exact masked path below;
- a mask, at most :data:`DECODE_MAX_QUERIES` query tokens over a longer cache, no gradients (the decode steps
  of ``generate`` with a static cache): the decode kernel, row ``b`` seeing keys ``[first real key, last real
  key]`` of its mask (left padding and the unwritten tail of a static cache). Like transformers'
  flash-attention integration this assumes each row's real tokens are contiguous: left padding (a right-padded
  prompt puts its pads between the prompt and the new tokens). A call whose queries are all its keys (no cache)
  takes the masked op below, whatever its length: right padding puts its real queries first;
- a mask over a batch-1 row that also carries packing (``cu_seq_lens_*``, or ``position_ids`` that may restart):
  the masked op with the row's segments, as the eager path, which drops a mask whose keys are all real and
  packs;
- a mask otherwise (prefill over a static cache, padded training batches): :mod:`.masked_op`'s op reads at
  run time whether every key is real, and runs the batched kernel or
  :func:`~.masked_op.masked_attention_with_lse`, the exact dense torch computation of the eager path's
  unpadding semantics, so a compiled model gives the same answer as an eager one.

A v with a head dim of its own (``D_v != D``, multi-head latent attention) takes the same routes, and out has
``D_v`` columns: the ops serve every pair (:mod:`hf_flashpatch.kernels.value_head_dim`).
"""

from __future__ import annotations

import torch

from .. import api
from ..reference.masks import normalize_window
from ..sinks import add_sinks
from .masked_op import key_range, masked_attention_op

DECODE_MAX_QUERIES = 4  # query tokens per row that the decode kernel takes under compile (speculative decoding)


def _kernel(q, k, v, attn, differentiable: bool) -> torch.Tensor:
    """out of the batched kernel (the decode kernel for few queries without gradients); fallbacks inside the ops."""
    left, right = normalize_window(attn["window"], attn["causal"])
    common = dict(softmax_scale=attn["softmax_scale"], softcap=attn["softcap"], window_left=left, window_right=right)
    if not differentiable and q.shape[1] <= DECODE_MAX_QUERIES and k.shape[1] > 1:
        return _with_sinks(api.decode_op(q, k, v, None, None, **common), attn)[0]
    return _with_sinks(api.attention_op(q, k, v, causal=attn["causal"], **common), attn)[0]


def _with_sinks(result, attn):
    """``(out, lse)`` of an op, with the call's sinks folded in (:mod:`hf_flashpatch.sinks`)."""
    return result if attn.get("sinks") is None else add_sinks(*result, attn["sinks"])


def traced_attention(q, k, v, attention_mask, position_ids, packed, attn, differentiable: bool):
    """Attention under ``torch.compile`` (see the module docstring). q ``(B, S_q, H, D)``, k ``(B, S_k, H_kv, D)``,
    v ``(B, S_k, H_kv, D_v)``; ``packed`` = ``(cu_q, cu_k, max_q, max_k)`` or None. -> ``(B, S_q, H, D_v)``."""
    batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
    if attention_mask is not None and batch == 1 and seqlen_q == seqlen_k > 1:
        segments = _packed_segments(packed, position_ids, seqlen_q, q.device)
        if segments is not None:
            return _masked(q, k, v, attention_mask.to(torch.bool), segments, attn)
    if packed is not None and attention_mask is None:
        cu_q, cu_k, max_q, max_k = packed
        max_q = max_q if isinstance(max_q, int) else q.shape[1]  # static upper bounds: they only size the grid
        max_k = max_k if isinstance(max_k, int) else k.shape[1]
        left, right = normalize_window(attn["window"], attn["causal"])
        out, _ = _with_sinks(api.attention_op(
            q[0], k[0], v[0], cu_seqlens_q=cu_q.int(), cu_seqlens_k=cu_k.int(), max_seqlen_q=max_q,
            max_seqlen_k=max_k, causal=attn["causal"], softmax_scale=attn["softmax_scale"], softcap=attn["softcap"],
            window_left=left, window_right=right,
        ), attn)  # fmt: skip
        return out[None]  # (1, T_q, H, D_v)
    if attention_mask is None:
        if batch == 1 and seqlen_q == seqlen_k > 1:
            segments = _packed_segments(None, position_ids, seqlen_q, q.device)
            if segments is not None:
                return _masked(q, k, v, torch.ones_like(segments, dtype=torch.bool), segments, attn)
        return _kernel(q, k, v, attn, differentiable)
    key_mask = attention_mask.to(torch.bool)  # (B, S_k)
    if not differentiable and seqlen_q <= DECODE_MAX_QUERIES and seqlen_q < seqlen_k:
        starts, ends = key_range(key_mask)
        left, right = normalize_window(attn["window"], attn["causal"])
        out, _ = _with_sinks(api.decode_op(
            q, k, v, ends, starts, softmax_scale=attn["softmax_scale"], softcap=attn["softcap"], window_left=left,
            window_right=right,
        ), attn)  # fmt: skip
        return out
    return _masked(q, k, v, key_mask, None, attn)


def _packed_segments(packed, position_ids, seqlen: int, device):
    """``(1, S)`` sequence numbers (from 1) of a batch-1 row: from ``cu_seq_lens_q`` when given (tokens past its
    end form one more segment), else from ``position_ids`` (a new sequence at the row's start and wherever the
    positions restart at their minimum); None when neither is there."""
    if packed is not None:
        cu = packed[0].to(device=device, dtype=torch.long)  # (num_seqs + 1,)
        return (torch.searchsorted(cu[1:], torch.arange(seqlen, device=device), right=True) + 1)[None]
    if position_ids is None or position_ids.dim() != 2 or position_ids.shape[-1] != seqlen:
        return None
    flat = position_ids.reshape(1, -1)  # (1, S)
    starts = (flat == flat.amin()) | (torch.arange(seqlen, device=flat.device) == 0)  # (1, S)
    return starts.long().cumsum(-1)  # (1, S)


def _masked(q, k, v, key_mask, segments, attn):
    """out of :data:`.masked_op.masked_attention_op` (the kernels when the batch is plain, else the exact dense path),
    with the call's sinks folded in."""
    left, right = normalize_window(attn["window"], attn["causal"])
    scale = attn["softmax_scale"] if attn["softmax_scale"] is not None else q.shape[-1] ** -0.5
    result = masked_attention_op(q, k, v, key_mask, segments, float(scale), attn["causal"], left, right,
                                 float(attn["softcap"] or 0.0))  # fmt: skip
    return _with_sinks(result, attn)[0]
