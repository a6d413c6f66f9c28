"""The op a compiled model runs where shapes cannot tell whether a batch is padded or packed.

Under ``torch.compile`` a padding mask, or ``position_ids`` that may restart within a row, does not say by its
shape whether any token is padding or starts a new sequence. ``hf_flashpatch::masked_attention`` reads that
flag at run time, inside the op: our attention op (the kernels, or their exact torch path) when the batch is
plain, else :func:`masked_attention_with_lse`, the exact dense computation of the eager path's unpadding
semantics (memory ``O(B H S_q S_k)``, the documented fallback). Its backward is an op of its own that decides
the same way: the kernels' backward from the saved ``(out, lse)``, or :func:`masked_attention_backward`.

Not a ``torch.cond`` in the graph: Dynamo cannot trace one in a frame that has changed a Python object before it
(a cache created inside the compiled region), and inductor may hand a branch its inputs in a layout other than
the one the branch was compiled for. The flag costs one device-to-host read per layer, as the cond's did.

Layout: q ``(B, S_q, H, D)``, k ``(B, S_k, H_kv, D)``, v ``(B, S_k, H_kv, D_v)``, ``key_mask`` ``(B, S_k)`` bool
(True = a real, written key), ``segments`` None or ``(B, S)`` int (``S_q == S_k``: packed sequences, numbered
from 1 along the row) -> out ``(B, S_q, H, D_v)`` in q's dtype, lse ``(B, H, S_q)`` fp32 (``-inf`` where a row
sees no key). ``window_left`` / ``window_right``: -1 unbounded, causal folded in as ``right = 0``.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..kernels import define_op, fold_window
from ..reference.masks import normalize_window
from ..sinks import add_sinks


def key_range(key_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """First real key and one past the last real key of each row of a ``(B, S_k)`` mask (0, 0 if none)."""
    index = torch.arange(key_mask.shape[1], device=key_mask.device, dtype=torch.int32)  # (S_k,)
    ends = torch.where(key_mask, index + 1, 0).amax(-1)  # (B,)
    starts = torch.where(key_mask, index, key_mask.shape[1]).amin(-1)
    return torch.minimum(starts, ends).int(), ends.int()


def _row_ranks(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For a ``(B, S)`` bool mask: each slot's index among its row's True slots, and the row's count."""
    ranks = mask.long().cumsum(-1) - 1  # (B, S)
    return ranks, mask.sum(-1)  # (B, S), (B,)


def _visible(key_mask, segments, seqlen_q: int, causal: bool, left: int, right: int) -> torch.Tensor:
    """Bool ``(B, S_q, S_k)``: which key each query row sees, with the eager path's unpadding semantics (see
    :func:`masked_attention_with_lse`); ``left`` / ``right`` folded (:func:`~hf_flashpatch.kernels.fold_window`)."""
    batch, seqlen_k = key_mask.shape
    device = key_mask.device
    if causal or seqlen_q == seqlen_k:
        _, ends = key_range(key_mask)
        query_cols = (ends.long() - seqlen_q).clamp_min(0)[:, None] + torch.arange(seqlen_q, device=device)  # (B, S_q)
        query_mask = key_mask.gather(1, query_cols.clamp_max(seqlen_k - 1)) & (query_cols < seqlen_k)  # (B, S_q)
    else:  # cross-attention (decoder queries, the encoder's key mask)
        query_mask = torch.ones(batch, seqlen_q, dtype=torch.bool, device=device)
    k_rank, n_k = _row_ranks(key_mask)
    q_rank, n_q = _row_ranks(query_mask)
    if segments is not None:  # number tokens from the start of their segment
        index = torch.arange(seqlen_k, device=device).expand(batch, -1)  # (B, S_k)
        starts = torch.where(torch.nn.functional.pad(segments.diff(dim=-1) != 0, (1, 0), value=True), index, 0)
        k_rank = index - starts.cummax(-1).values  # (B, S_k)
        q_pos = k_rank[:, seqlen_k - seqlen_q :]
    else:
        q_pos = q_rank + (n_k - n_q)[:, None]  # (B, S_q): bottom-right alignment per row
    visible = key_mask[:, None, :] & query_mask[:, :, None]  # (B, S_q, S_k)
    if segments is not None:
        visible = visible & (segments[:, seqlen_k - seqlen_q :, None] == segments[:, None, :])
    if left >= 0:
        visible = visible & (k_rank[:, None, :] >= q_pos[:, :, None] - left)
    if right >= 0:
        visible = visible & (k_rank[:, None, :] <= q_pos[:, :, None] + right)
    return visible


def _grouped(q, k, v):
    """fp32 q ``(B, H_kv, G, S_q, D)``, k ``(B, H_kv, 1, S_k, D)``, v ``(B, H_kv, 1, S_k, D_v)``: each KV head's
    group of query heads together (GQA read natively)."""
    batch, seqlen_q, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    qf = q.float().reshape(batch, seqlen_q, kv_heads, heads // kv_heads, head_dim).permute(0, 2, 3, 1, 4)
    return qf, k.float().permute(0, 2, 1, 3)[:, :, None], v.float().permute(0, 2, 1, 3)[:, :, None]


def _scores(qf, kf, visible, softmax_scale: float, softcap: float):
    """Masked scores ``(B, H_kv, G, S_q, S_k)`` and, with a softcap, its ``tanh`` (for the backward)."""
    scores = torch.matmul(qf, kf.transpose(-1, -2)) * softmax_scale
    capped = None
    if softcap:
        capped = torch.tanh(scores / softcap)
        scores = softcap * capped
    return scores.masked_fill(~visible[:, None, None], float("-inf")), capped


def masked_attention_with_lse(q, k, v, key_mask, segments, softmax_scale: float, causal: bool, left: int, right: int,
                              softcap: float):  # fmt: skip
    """The exact dense path (traceable) -> ``(out, lse)``; layouts in the module docstring.

    As in the eager path (unpad, run varlen, pad back): the queries are the last ``S_q`` mask columns before the
    row's last real key (a non-causal call with ``S_q != S_k``, cross-attention: every query row is real); each
    row's real tokens are numbered in order, and causal and window compare those numbers (bottom-right aligned per
    row); padded query rows give 0. ``segments``: keys visible only within the query's segment, numbered from the
    segment's start.
    """
    batch, seqlen_q, heads, _ = q.shape
    left, right = fold_window(causal, left, right)
    visible = _visible(key_mask, segments, seqlen_q, causal, left, right)
    qf, kf, vf = _grouped(q, k, v)
    scores, _ = _scores(qf, kf, visible, softmax_scale, softcap)
    lse = torch.logsumexp(scores, dim=-1)  # (B, H_kv, G, S_q); -inf where a row sees no key
    probs = torch.exp(scores - lse.clamp_min(-1e30)[..., None])  # 0 where masked or no key
    out = torch.matmul(probs, vf)  # (B, H_kv, G, S_q, D_v)
    out = out.permute(0, 3, 1, 2, 4).reshape(batch, seqlen_q, heads, v.shape[-1])  # (B, S_q, H, D_v), a view
    return out.to(q.dtype).contiguous(), lse.reshape(batch, heads, seqlen_q)


def masked_attention_backward(dout, dlse, q, k, v, key_mask, segments, out, lse, softmax_scale: float, causal: bool,
                              left: int, right: int, softcap: float):  # fmt: skip
    """Gradients ``(dq, dk, dv)`` of :func:`masked_attention_with_lse` from its saved ``(out, lse)`` (FlashAttention's
    recomputation: ``dS = P * (dP - rowsum(dO * O) + dlse)``), in q/k/v's dtypes."""
    batch, seqlen_q, heads, head_dim = q.shape
    kv_heads, group = k.shape[2], heads // k.shape[2]
    left, right = fold_window(causal, left, right)
    visible = _visible(key_mask, segments, seqlen_q, causal, left, right)
    qf, kf, vf = _grouped(q, k, v)
    scores, capped = _scores(qf, kf, visible, softmax_scale, softcap)
    grouped_lse = lse.reshape(batch, kv_heads, group, seqlen_q)  # (B, H_kv, G, S_q)
    probs = torch.exp(scores - grouped_lse.clamp_min(-1e30)[..., None])  # (B, H_kv, G, S_q, S_k)

    def grouped_rows(t):  # (B, S_q, H, X) -> fp32 (B, H_kv, G, S_q, X)
        return t.float().reshape(batch, seqlen_q, kv_heads, group, t.shape[-1]).permute(0, 2, 3, 1, 4)

    d_out, o = grouped_rows(dout), grouped_rows(out)
    dv = torch.matmul(probs.transpose(-1, -2), d_out).sum(2)  # (B, H_kv, S_k, D_v)
    d_probs = torch.matmul(d_out, vf.transpose(-1, -2))  # (B, H_kv, G, S_q, S_k)
    row_term = (d_out * o).sum(-1, keepdim=True)  # (B, H_kv, G, S_q, 1)
    if dlse is not None:
        row_term = row_term - dlse.reshape(batch, kv_heads, group, seqlen_q, 1).float()
    d_scores = probs * (d_probs - row_term)
    if capped is not None:
        d_scores = d_scores * (1 - capped * capped)  # through softcap * tanh(s / softcap)
    d_scores = d_scores * softmax_scale
    dq = torch.matmul(d_scores, kf)  # (B, H_kv, G, S_q, D)
    dk = torch.matmul(d_scores.transpose(-1, -2), qf).sum(2)  # (B, H_kv, S_k, D)
    dq = dq.permute(0, 3, 1, 2, 4).reshape(batch, seqlen_q, heads, head_dim)  # (B, S_q, H, D)
    return (dq.to(q.dtype).contiguous(), dk.permute(0, 2, 1, 3).to(k.dtype).contiguous(),
            dv.permute(0, 2, 1, 3).to(v.dtype).contiguous())  # fmt: skip


def masked_attention(q, k, v, key_mask, *, causal, softmax_scale, window, softcap, sinks=None, segments=None):
    """:func:`masked_attention_with_lse` with the backend's arguments (``window`` a ``(left, right)`` pair or None,
    ``softmax_scale`` None = ``1 / sqrt(D)``, ``sinks`` ``(H,)`` folded in) -> out ``(B, S_q, H, D_v)``."""
    left, right = normalize_window(window, causal)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    result = masked_attention_with_lse(q, k, v, key_mask, segments, scale, causal, left, right, softcap or 0.0)
    return result[0] if sinks is None else add_sinks(*result, sinks)[0]


def _plain(key_mask: torch.Tensor, segments: Optional[torch.Tensor]) -> bool:
    """Whether the kernels' batched call computes the same: every key real, one sequence a row (a host read)."""
    plain = key_mask.all()
    if segments is not None:
        plain = plain & (segments[:, -1].max() <= 1)
    return bool(plain)


def _forward_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor,
                  segments: Optional[torch.Tensor], softmax_scale: float, causal: bool, window_left: int,
                  window_right: int, softcap: float) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    if _plain(key_mask, segments):
        from ..kernels import forward

        return forward.attention_forward(q, k, v, causal=causal, softmax_scale=softmax_scale, window_left=window_left,
                                         window_right=window_right, softcap=softcap, torch_fallback=True)  # fmt: skip
    return masked_attention_with_lse(q, k, v, key_mask, segments, softmax_scale, causal, window_left, window_right,
                                     softcap)  # fmt: skip


def _forward_fake(q, k, v, key_mask, segments, softmax_scale, causal, window_left, window_right, softcap):
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))  # (B, S_q, H, D_v), contiguous
    return out, q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)  # lse (B, H, S_q)


def _backward_impl(dout: torch.Tensor, dlse: Optional[torch.Tensor], q: torch.Tensor, k: torch.Tensor,
                   v: torch.Tensor, key_mask: torch.Tensor, segments: Optional[torch.Tensor], out: torch.Tensor,
                   lse: torch.Tensor, softmax_scale: float, causal: bool, window_left: int, window_right: int,
                   softcap: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    if _plain(key_mask, segments):
        left, right = fold_window(causal, window_left, window_right)
        grads = torch.ops.hf_flashpatch.attention_backward(
            dout, q, k, v, out, lse, dlse, None, None, q.shape[1], k.shape[1], softmax_scale, left, right, softcap, False
        )
    else:
        grads = masked_attention_backward(dout, dlse, q, k, v, key_mask, segments, out, lse, softmax_scale, causal,
                                          window_left, window_right, softcap)  # fmt: skip
    return tuple(g.contiguous() for g in grads)  # contiguous, as the fake's are


def _backward_fake(dout, dlse, q, k, v, key_mask, segments, out, lse, softmax_scale, causal, window_left, window_right,
                   softcap):  # fmt: skip
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, key_mask, segments, softmax_scale, causal, window_left, window_right, softcap = inputs
    ctx.save_for_backward(q, k, v, key_mask, segments, *output)
    ctx.attrs = (softmax_scale, causal, window_left, window_right, softcap)


def _backward(ctx, dout, dlse):
    q, k, v, key_mask, segments, out, lse = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = torch.ops.hf_flashpatch.masked_attention_backward(dout, dlse, q, k, v, key_mask, segments, out, lse,
                                                                    *ctx.attrs)  # fmt: skip
    return dq, dk, dv, None, None, None, None, None, None, None


# Both read a flag on the host: inductor keeps them out of CUDA graphs (mode="reduce-overhead") rather than capture
# a sync. (A compiled decode step, the graphs transformers captures, runs the decode op instead.)
_HOST_READ = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()
define_op("masked_attention_backward", _backward_impl, _backward_fake, _HOST_READ)
masked_attention_op = define_op("masked_attention", _forward_impl, _forward_fake, _HOST_READ)
torch.library.register_autograd("hf_flashpatch::masked_attention", _backward, setup_context=_setup_context)
