"""Tiled attention with an online softmax, in torch: the kernels' algorithm, readable.

Same layout and contract as :func:`hf_flashpatch.reference.naive.attention_reference`: q
``(B, S_q, H, D)``, k ``(B, S_k, H_kv, D)``, v ``(B, S_k, H_kv, D_v)`` (``D_v`` may differ from ``D``),
returns ``out (B, S_q, H, D_v)`` and ``lse (B, H, S_q)``.
It walks K/V in tiles of ``block_n`` keys for each tile of ``block_m`` queries, keeps the running
(max, sum, output) state of :class:`SoftmaxState` and never builds more than a
``block_m x block_n`` score tile. Tiles that the causal/window mask hides completely are skipped,
as the CUDA kernels skip them.
"""

from __future__ import annotations

import math

import torch

from .masks import normalize_window, visibility_mask
from .online_softmax import SoftmaxState


def attention_tiled(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                    softmax_scale: float | None = None, window=None, softcap: float | None = None, block_m: int = 64,
                    block_n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, kv_heads = k.shape[1], k.shape[2]
    group = heads // kv_heads
    head_dim_v = v.shape[-1]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    left, right = normalize_window(window, causal)
    offset = seqlen_k - seqlen_q

    # GQA read natively: view q as (B, H_kv, group, S_q, D) so each KV head serves its group.
    qg = q.float().transpose(1, 2).reshape(batch, kv_heads, group, seqlen_q, head_dim)
    kf = k.float().transpose(1, 2)  # (B, H_kv, S_k, D)
    vf = v.float().transpose(1, 2)  # (B, H_kv, S_k, D_v)
    out = torch.empty(batch, kv_heads, group, seqlen_q, head_dim_v, dtype=torch.float32, device=q.device)
    lse = torch.empty(batch, kv_heads, group, seqlen_q, dtype=torch.float32, device=q.device)

    for m0 in range(0, seqlen_q, block_m):
        m1 = min(m0 + block_m, seqlen_q)
        state = SoftmaxState.empty((batch, kv_heads, group, m1 - m0), head_dim_v, device=q.device)
        # Key range this query tile can see at all; tiles outside it are never loaded.
        k_lo = 0 if left < 0 else max(0, m0 + offset - left)
        k_hi = seqlen_k if right < 0 else min(seqlen_k, m1 - 1 + offset + right + 1)
        for n0 in range((k_lo // block_n) * block_n, k_hi, block_n):
            n1 = min(n0 + block_n, seqlen_k)
            s = torch.einsum("bkgmd,bknd->bkgmn", qg[:, :, :, m0:m1], kf[:, :, n0:n1]) * scale
            if softcap and math.isfinite(softcap):  # inf is no cap
                s = softcap * torch.tanh(s / softcap)
            tile_mask = visibility_mask(
                seqlen_q, seqlen_k, left, right, device=q.device, q_range=(m0, m1), k_range=(n0, n1)
            )
            s = s.masked_fill(~tile_mask, float("-inf"))  # (B, H_kv, g, bm, bn)
            state.update(s, vf[:, :, None, n0:n1])
        o, l = state.normalize()
        out[:, :, :, m0:m1] = o
        lse[:, :, :, m0:m1] = l
    out = out.reshape(batch, heads, seqlen_q, head_dim_v).transpose(1, 2)  # (B, S_q, H, D_v)
    return out.to(q.dtype), lse.reshape(batch, heads, seqlen_q)
