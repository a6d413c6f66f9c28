"""The forward's torch path inside the custom ops: exact ``(out, lse)`` where no CUDA kernel serves a call.

The ops ``hf_flashpatch::attention_forward`` and ``hf_flashpatch::decode`` run this on CPU (so a model
compiled with ``torch.compile`` on CPU traces exactly the same graph as on the GPU) and on CUDA calls
that the kernels decline (fp32, an unsupported head dim, no nvcc). The backward of a call served here is
:mod:`.backward_torch`, which needs only ``out`` and ``lse``.

Layout: q ``(B, S_q, H, D)``, k ``(B, S_k, H_kv, D)``, v ``(B, S_k, H_kv, D_v)`` -> out ``(B, S_q, H, D_v)``
in q's dtype, lse ``(B, H, S_q)`` fp32; varlen q ``(T_q, H, D)`` with int32 ``cu_seqlens`` -> out
``(T_q, H, D_v)``, lse ``(H, T_q)``.
Row ``b`` sees keys ``[key_start[b], key_end[b])`` (defaults ``0`` and ``S_k``); queries are the last tokens
of that range (bottom-right alignment), and ``left``/``right`` are the window (``-1`` unbounded, causal
already folded into ``right = 0``). Rows that see no key give 0 and
``lse = -inf``. Work is chunked over queries, so memory is ``O(chunk * S_k)``, never ``S_q * S_k``.
"""

from __future__ import annotations

import torch

_CHUNK_ELEMS = 1 << 24  # scores per chunk: B * H * rows * S_k fp32


def attention_with_lse(q, k, v, scale: float, left: int, right: int, softcap: float, key_start=None, key_end=None):
    """Batched form (see the module docstring) -> ``(out, lse)``."""
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, kv_heads, head_dim_v = k.shape[1], k.shape[2], v.shape[-1]
    group = heads // kv_heads
    device = q.device
    starts = torch.zeros(batch, dtype=torch.long, device=device) if key_start is None else key_start.long()
    ends = torch.full((batch,), seqlen_k, dtype=torch.long, device=device) if key_end is None else key_end.long()
    kf = k.float().permute(0, 2, 1, 3)[:, :, None]  # (B, H_kv, 1, S_k, D)
    vf = v.float().permute(0, 2, 1, 3)[:, :, None]  # (B, H_kv, 1, S_k, D_v)
    qf = q.float().reshape(batch, seqlen_q, kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)  # (B, H_kv, G, S_q, D)
    kpos = torch.arange(seqlen_k, device=device)  # (S_k,)
    out = torch.empty(batch, kv_heads, group, seqlen_q, head_dim_v, dtype=torch.float32, device=device)
    lse = torch.empty(batch, kv_heads, group, seqlen_q, dtype=torch.float32, device=device)
    chunk = max(1, min(seqlen_q, _CHUNK_ELEMS // max(1, batch * heads * seqlen_k)))
    for q0 in range(0, seqlen_q, chunk):
        q1 = min(seqlen_q, q0 + chunk)
        # query i of row b sits at key position ends[b] - S_q + i
        qpos = (ends[:, None] - seqlen_q + torch.arange(q0, q1, device=device)[None, :])[:, :, None]  # (B, c, 1)
        visible = (kpos >= starts[:, None, None]) & (kpos < ends[:, None, None])  # (B, 1, S_k)
        if left >= 0:
            visible = visible & (kpos >= qpos - left)
        if right >= 0:
            visible = visible & (kpos <= qpos + right)
        scores = torch.matmul(qf[..., q0:q1, :], kf.transpose(-1, -2)) * scale  # (B, H_kv, G, c, S_k)
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        scores = scores.masked_fill(~visible[:, None, None], float("-inf"))
        row_lse = torch.logsumexp(scores, dim=-1)  # (B, H_kv, G, c); -inf where no key is visible
        probs = torch.exp(scores - row_lse.clamp_min(-1e30)[..., None])  # 0 where masked or no key
        out[..., q0:q1, :] = torch.matmul(probs, vf)
        lse[..., q0:q1] = row_lse
    out = out.permute(0, 3, 1, 2, 4).reshape(batch, seqlen_q, heads, head_dim_v)  # (B, S_q, H, D_v), a view
    return out.to(q.dtype).contiguous(), lse.reshape(batch, heads, seqlen_q)


def varlen_attention_with_lse(q, k, v, cu_seqlens_q, cu_seqlens_k, scale: float, left: int, right: int,
                              softcap: float):  # fmt: skip
    """Varlen form (see the module docstring) -> ``(out (T_q, H, D_v), lse (H, T_q))``; one sequence at a time."""
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)  # (T_q, H, D_v)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float32, device=q.device)  # (H, T_q)
    bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(bounds_q) - 1):
        q0, q1, k0, k1 = bounds_q[b], bounds_q[b + 1], bounds_k[b], bounds_k[b + 1]
        if q1 <= q0:
            continue
        o_b, lse_b = attention_with_lse(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], scale, left, right, softcap)
        out[q0:q1] = o_b[0]
        lse[:, q0:q1] = lse_b[0]
    return out, lse
