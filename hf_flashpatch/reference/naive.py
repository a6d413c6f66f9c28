"""The definition of correct: naive attention in fp32, materialising the full score matrix.

Layout: q ``(B, S_q, H, D)``, k ``(B, S_k, H_kv, D)`` and v ``(B, S_k, H_kv, D_v)`` with ``H % H_kv == 0``
(``D_v``, v's ``head_dim_v``, may differ from ``D``, as in multi-head latent attention); query head ``h``
reads KV head ``h // (H // H_kv)`` (transformers' ``repeat_kv`` grouping). The default scale is
``1 / sqrt(D)``, the q/k head dim. Returns ``out (B, S_q, H, D_v)`` in q's dtype and ``lse (B, H, S_q)`` in
fp32 (fp64 for fp64 inputs; natural log of the softmax
denominator of the scaled, soft-capped scores). Rows that see no key give ``out = 0`` and
``lse = -inf``; a NaN score gives NaN in its row, as in torch. ``softcap`` None, 0 or inf: no cap. Slow and memory hungry on purpose: this is the oracle, not a fast path.
"""

from __future__ import annotations

import math

import torch

from .masks import normalize_window, visibility_mask


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                        softmax_scale: float | None = None, window=None, softcap: float | None = None,
                        key_padding_mask: torch.Tensor | None = None,
                        sinks: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Naive fp32 attention. ``key_padding_mask``: optional bool ``(B, S_k)``, True = real key. ``sinks``:
    optional ``(H,)``, one extra logit per query head in every row's softmax, with no value (GPT-OSS);
    the lse includes it."""
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, kv_heads = k.shape[1], k.shape[2]
    group = heads // kv_heads
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    left, right = normalize_window(window, causal)

    acc = torch.promote_types(q.dtype, torch.float32)  # fp32, or fp64 for fp64 inputs
    qf = q.to(acc).transpose(1, 2)  # (B, H, S_q, D)
    kf = k.to(acc).transpose(1, 2).repeat_interleave(group, dim=1)  # (B, H, S_k, D)
    vf = v.to(acc).transpose(1, 2).repeat_interleave(group, dim=1)  # (B, H, S_k, D_v)
    scores = torch.matmul(qf, kf.transpose(-1, -2)) * scale  # (B, H, S_q, S_k)
    if softcap and math.isfinite(softcap):  # inf is no cap (inf * tanh(s / inf) would be NaN)
        scores = softcap * torch.tanh(scores / softcap)
    visible = visibility_mask(seqlen_q, seqlen_k, left, right, device=q.device)[None, None]  # (1, 1, S_q, S_k)
    if key_padding_mask is not None:
        visible = visible & key_padding_mask.bool()[:, None, None, :]  # (B, 1, S_q, S_k)
    scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None:  # one more column in the softmax: the sink's logit, whose value row is zero
        sink_column = sinks.to(acc)[None, :, None, None].expand(batch, heads, seqlen_q, 1)  # (B, H, S_q, 1)
        scores = torch.cat([scores, sink_column], dim=-1)  # (B, H, S_q, S_k + 1)
        vf = torch.cat([vf, vf.new_zeros(batch, heads, 1, vf.shape[-1])], dim=2)  # (B, H, S_k + 1, D_v)
    lse = torch.logsumexp(scores, dim=-1)  # (B, H, S_q)
    # Rows with no visible key: lse = -inf is clamped to the lowest finite value, so exp(-inf - min)
    # = 0 and they give zeros, while a NaN score still gives NaN.
    probs = torch.exp(scores - lse.unsqueeze(-1).clamp_min(torch.finfo(acc).min))
    out = torch.matmul(probs, vf)  # (B, H, S_q, D_v)
    return out.transpose(1, 2).to(q.dtype), lse


def varlen_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed sequences. q ``(total_q, H, D)``, k ``(total_k, H_kv, D)``, v ``(total_k, H_kv, D_v)``,
    cu_seqlens int ``(num_seqs + 1,)``. Returns ``out (total_q, H, D_v)`` and ``lse (H, total_q)`` fp32."""
    out = q.new_zeros(*q.shape[:-1], v.shape[-1])  # (total_q, H, D_v)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float32, device=q.device)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for i in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[i], cq[i + 1], ck[i], ck[i + 1]
        if q1 == q0:
            continue
        o, l = attention_reference(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], **kwargs)
        out[q0:q1] = o[0]
        lse[:, q0:q1] = l[0]
    return out, lse
