"""Attention sinks folded into a finished attention result.

A sink (GPT-OSS's ``sinks``, transformers' ``s_aux``) is one learned logit per query head that joins
every row's softmax denominator without a value: with the row's scaled (soft-capped, masked) scores
``s_j`` and ``Z = sum_j exp(s_j) = exp(lse)``,

    out' = sum_j exp(s_j) v_j / (Z + exp(sink)) = out * sigmoid(lse - sink),   lse' = logaddexp(lse, sink).

So every kernel serves sinks unchanged: it returns ``(out, lse)`` and these two elementwise ops finish
the job, differentiably (the kernels' backward takes a gradient on ``lse``). A row that sees no key
(``lse = -inf``) stays 0, as it does when the sink is the only logit in its softmax.
"""

from __future__ import annotations

import torch


def add_sinks(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out', lse')`` with the sinks in the denominator.

    Batched: out ``(B, S_q, H, D)``, lse ``(B, H, S_q)``; packed: out ``(T_q, H, D)``, lse ``(H, T_q)``;
    sinks ``(H,)``. out' keeps out's dtype, lse' is fp32."""
    sink = sinks.float()
    if out.dim() == 4:
        sink = sink[None, :, None]  # (1, H, 1) against lse (B, H, S_q)
        factor = torch.sigmoid(lse - sink).transpose(1, 2)[..., None]  # (B, S_q, H, 1)
    else:
        sink = sink[:, None]  # (H, 1) against lse (H, T_q)
        factor = torch.sigmoid(lse - sink).transpose(0, 1)[..., None]  # (T_q, H, 1)
    return (out * factor).to(out.dtype), torch.logaddexp(lse, sink)
