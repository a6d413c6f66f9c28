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
  ``position_ids`` may hold several packed sequences; ``torch.cond`` on a device flag picks the batched
  kernel or the exact masked path below;
- a mask and at most :data:`DECODE_MAX_QUERIES` query tokens without gradients (``generate`` with a
  static cache): the decode kernel, row ``b`` seeing keys ``[first real key, last real key]`` of its mask
  (left padding and the unwritten tail of a static cache). Like transformers' flash-attention
  integration this assumes each row's real tokens are contiguous (left or right padding);
- a mask otherwise (prefill over a static cache, padded training batches): ``torch.cond`` on "every key
  is real" picks the batched kernel or :func:`masked_attention`, the exact dense torch computation of
  the eager path's unpadding semantics, so a compiled model gives the same answer as an eager one.

A v with a head dim of its own (``D_v != D``, multi-head latent attention) takes the same routes, and out has
``D_v`` columns: the ops serve every pair (:mod:`hf_flashpatch.kernels.value_head_dim`).
"""

from __future__ import annotations

import torch

from .. import api
from ..sinks import add_sinks
from ..reference.masks import normalize_window

DECODE_MAX_QUERIES = 4  # query tokens per row that the decode kernel takes under compile (speculative decoding)


def _row_ranks(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For a ``(B, S)`` bool mask: each slot's index among its row's True slots, and the row's count."""
    ranks = mask.long().cumsum(-1) - 1  # (B, S)
    return ranks, mask.sum(-1)  # (B, S), (B,)


def masked_attention(q, k, v, key_mask, *, causal, softmax_scale, window, softcap, sinks=None, segments=None):
    """Exact attention over a padded batch (traceable, differentiable, memory ``O(B H S_q S_k)``).

    q ``(B, S_q, H, D)``, k ``(B, S_k, H_kv, D)``, v ``(B, S_k, H_kv, D_v)``, ``key_mask`` ``(B, S_k)`` bool
    -> ``(B, S_q, H, D_v)``. As in the eager path
    (unpad, run varlen, pad back): the queries are the last ``S_q`` mask columns (a non-causal call with
    ``S_q != S_k``, cross-attention: every query row is real), each row's real tokens
    are numbered in order, causal and window compare those numbers (bottom-right aligned per row), padded
    query rows give 0. ``segments`` ``(B, S_k)`` (S_q == S_k): packed sequences, keys visible only within
    the query's segment, numbered from each segment's start. ``sinks`` ``(H,)``: one more logit per query
    head in every denominator (:mod:`hf_flashpatch.sinks`).
    """
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, kv_heads = k.shape[1], k.shape[2]
    if causal or seqlen_q == seqlen_k:
        # The queries are the last S_q columns before the row's last real key (a static cache's unwritten
        # tail lies beyond it; left padding puts the queries in the last columns).
        _, ends = _key_range(key_mask)
        query_cols = (ends.long() - seqlen_q).clamp_min(0)[:, None] + torch.arange(seqlen_q, device=q.device)  # (B, S_q)
        query_mask = key_mask.gather(1, query_cols.clamp_max(seqlen_k - 1)) & (query_cols < seqlen_k)  # (B, S_q)
    else:  # cross-attention (decoder queries, the encoder's key mask): every query row is computed
        query_mask = torch.ones(batch, seqlen_q, dtype=torch.bool, device=q.device)
    k_rank, n_k = _row_ranks(key_mask)
    q_rank, n_q = _row_ranks(query_mask)
    if segments is not None:  # number tokens from the start of their segment
        index = torch.arange(seqlen_k, device=q.device).expand(batch, -1)  # (B, S_k)
        starts = torch.where(torch.nn.functional.pad(segments.diff(dim=-1) != 0, (1, 0), value=True), index, 0)
        k_rank = index - starts.cummax(-1).values  # (B, S_k)
        q_pos = q_rank = k_rank[:, seqlen_k - seqlen_q :]
    else:
        q_pos = q_rank + (n_k - n_q)[:, None]  # (B, S_q): bottom-right alignment per row
    left, right = normalize_window(window, causal)
    visible = key_mask[:, None, :] & query_mask[:, :, None]  # (B, S_q, S_k)
    if segments is not None:
        visible = visible & (segments[:, seqlen_k - seqlen_q :, None] == segments[:, None, :])
    if left >= 0:
        visible = visible & (k_rank[:, None, :] >= q_pos[:, :, None] - left)
    if right >= 0:
        visible = visible & (k_rank[:, None, :] <= q_pos[:, :, None] + right)
    scale = softmax_scale if softmax_scale is not None else head_dim**-0.5
    group = heads // kv_heads
    qf = q.float().reshape(batch, seqlen_q, kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)  # (B, H_kv, G, S_q, D)
    kf = k.float().permute(0, 2, 1, 3)[:, :, None]  # (B, H_kv, 1, S_k, D)
    vf = v.float().permute(0, 2, 1, 3)[:, :, None]  # (B, H_kv, 1, S_k, D_v)
    scores = torch.matmul(qf, kf.transpose(-1, -2)) * scale  # (B, H_kv, G, S_q, S_k)
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~visible[:, None, None], float("-inf"))
    row_max = scores.amax(-1, keepdim=True)
    if sinks is not None:
        sink = sinks.float().view(kv_heads, group)[None, :, :, None, None]  # (1, H_kv, G, 1, 1): head kv * G + g
        row_max = torch.maximum(row_max, sink)
    row_max = row_max.clamp_min(-1e30)  # finite where a row sees no key
    probs = torch.exp(scores - row_max)
    denominator = probs.sum(-1, keepdim=True)
    if sinks is not None:
        denominator = denominator + torch.exp(sink - row_max)
    probs = probs / denominator.clamp_min(1e-30)  # rows with no key stay 0
    out = torch.matmul(probs, vf)  # (B, H_kv, G, S_q, D_v)
    out = out.permute(0, 3, 1, 2, 4).reshape(batch, seqlen_q, heads, v.shape[-1])  # (B, S_q, H, D_v), a view
    return out.to(q.dtype).contiguous()


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose gradient is contiguous: ``torch.cond`` needs both branches' gradients laid out alike,
    and the kernel op's gradients are contiguous."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


def _key_range(key_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """First real key and one past the last real key of each row of a ``(B, S_k)`` mask (0, 0 if none)."""
    index = torch.arange(key_mask.shape[1], device=key_mask.device, dtype=torch.int32)  # (S_k,)
    ends = torch.where(key_mask, index + 1, 0).amax(-1)  # (B,)
    starts = torch.where(key_mask, index, key_mask.shape[1]).amin(-1)
    return torch.minimum(starts, ends).int(), ends.int()


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
        if position_ids is not None and batch == 1 and seqlen_q == seqlen_k > 1 and position_ids.dim() == 2:
            flat = position_ids.reshape(1, -1)  # (1, S)
            starts = (flat == flat.amin()) | (torch.arange(seqlen_q, device=flat.device) == 0)  # (1, S)
            segments = starts.long().cumsum(-1)  # (1, S): a new sequence at the row's start and where positions restart
            all_real = torch.ones_like(flat, dtype=torch.bool)
            return torch.cond(
                segments[0, -1] > 1,
                lambda q, k, v, seg: masked_attention(*_contiguous_grads(q, k, v), all_real, segments=seg, **attn),
                lambda q, k, v, seg: _kernel(q, k, v, attn, differentiable),
                _cond_operands(q, k, v, segments),
            )
        return _kernel(q, k, v, attn, differentiable)
    key_mask = attention_mask.to(torch.bool)  # (B, S_k)
    if not differentiable and seqlen_q <= DECODE_MAX_QUERIES:
        starts, ends = _key_range(key_mask)
        left, right = normalize_window(attn["window"], attn["causal"])
        out, _ = _with_sinks(api.decode_op(
            q, k, v, ends, starts, softmax_scale=attn["softmax_scale"], softcap=attn["softcap"], window_left=left,
            window_right=right,
        ), attn)  # fmt: skip
        return out
    return torch.cond(
        key_mask.all(),
        lambda q, k, v, m: _kernel(q, k, v, attn, differentiable),
        lambda q, k, v, m: masked_attention(*_contiguous_grads(q, k, v), m, **attn),
        _cond_operands(q, k, v, key_mask),
    )


def _contiguous_grads(*tensors):
    return tuple(_ContiguousGrad.apply(t) for t in tensors)


def _cond_operands(q, k, v, extra):
    """``torch.cond`` needs both branches' inputs and gradients laid out alike: contiguous q, k, v."""
    return (q.contiguous(), k.contiguous(), v.contiguous(), extra)
