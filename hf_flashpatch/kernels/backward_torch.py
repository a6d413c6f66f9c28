"""The backward's torch fallback (no CUDA kernel): gradients of attention from the saved ``out``/``lse``.

Layout: q ``(B, S_q, H, D)``, out/dout ``(B, S_q, H, D_v)``, k ``(B, S_k, H_kv, D)``, v ``(B, S_k, H_kv, D_v)``
(``D_v`` may differ from ``D``), lse/dlse ``(B, H, S_q)``; varlen: the same without the batch dim, lse
``(H, T_q)``, with ``cu_seqlens``. It recomputes
``P = exp(S - lse)`` in fp32 one query chunk at a time (memory ``O(chunk * S_k)``), applies the same
formulas as ``cuda/bwd.cu`` (softcap chain rule, ``D = rowsum(dO * O) - dLSE``), serves GQA by grouping
query heads (no ``repeat_kv`` copy) and varlen sequence by sequence. Used by
:mod:`hf_flashpatch.kernels.backward` where the kernels raise :class:`KernelUnsupported`.
"""

from __future__ import annotations

import torch

def _visible(seqlen_q: int, seqlen_k: int, q0: int, q1: int, left: int, right: int, device) -> torch.Tensor:
    """Bool (q1 - q0, seqlen_k): query i sees key j (bottom-right aligned window, -1 unbounded)."""
    qpos = torch.arange(q0, q1, device=device)[:, None] + (seqlen_k - seqlen_q)  # (c, 1)
    kpos = torch.arange(seqlen_k, device=device)[None, :]  # (1, S_k)
    mask = torch.ones(q1 - q0, seqlen_k, dtype=torch.bool, device=device)
    if left >= 0:
        mask &= kpos >= qpos - left
    if right >= 0:
        mask &= kpos <= qpos + right
    return mask


def _torch_backward_batched(dout, q, k, v, out, lse, dlse, scale, left, right, softcap):
    """q (B, S_q, H, D), out/dout (B, S_q, H, D_v), k (B, S_k, H_kv, D), v (B, S_k, H_kv, D_v), lse/dlse
    (B, H, S_q) -> fp32 dq, dk, dv."""
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, kv_heads = k.shape[1], k.shape[2]
    group = heads // kv_heads

    def by_group(t):  # (B, S, H, D or D_v) -> (B, H_kv, G, S, D or D_v)
        return t.float().reshape(batch, t.shape[1], kv_heads, group, t.shape[-1]).permute(0, 2, 3, 1, 4)

    qf, dof = by_group(q), by_group(dout)
    kf = k.float().permute(0, 2, 1, 3).unsqueeze(2)  # (B, H_kv, 1, S_k, D)
    vf = v.float().permute(0, 2, 1, 3).unsqueeze(2)  # (B, H_kv, 1, S_k, D_v)
    lse_g = lse.float().reshape(batch, kv_heads, group, seqlen_q)  # (B, H_kv, G, S_q)
    dvec = (dof * by_group(out)).sum(-1)  # (B, H_kv, G, S_q)
    if dlse is not None:
        dvec = dvec - dlse.float().reshape(batch, kv_heads, group, seqlen_q)
    dq = torch.empty_like(qf)
    dk = torch.zeros(batch, kv_heads, seqlen_k, head_dim, dtype=torch.float32, device=q.device)
    dv = torch.zeros(batch, kv_heads, seqlen_k, v.shape[-1], dtype=torch.float32, device=q.device)
    chunk = max(1, min(seqlen_q, (1 << 25) // max(1, batch * heads * seqlen_k)))
    for q0 in range(0, seqlen_q, chunk):
        q1 = min(seqlen_q, q0 + chunk)
        s = torch.matmul(qf[..., q0:q1, :], kf.transpose(-1, -2)) * scale  # (B, H_kv, G, c, S_k)
        if softcap:
            t = torch.tanh(s / softcap)
            s = softcap * t
        row_lse = lse_g[..., q0:q1, None]  # (B, H_kv, G, c, 1)
        # rows that saw no key (lse = -inf) get no gradient; a NaN lse (NaN in q or k) propagates, as in torch
        keep = _visible(seqlen_q, seqlen_k, q0, q1, left, right, q.device) & (row_lse != float("-inf"))
        p = torch.where(keep, torch.exp(s - row_lse.clamp_min(-1e30)), 0.0)  # (B, H_kv, G, c, S_k)
        do_c = dof[..., q0:q1, :]  # (B, H_kv, G, c, D_v)
        dv += torch.matmul(p.transpose(-1, -2), do_c).sum(2)  # (B, H_kv, S_k, D_v)
        ds = p * (torch.matmul(do_c, vf.transpose(-1, -2)) - dvec[..., q0:q1, None])
        if softcap:
            ds = ds * (1.0 - t * t)
        dq[..., q0:q1, :] = torch.matmul(ds, kf) * scale
        dk += torch.matmul(ds.transpose(-1, -2), qf[..., q0:q1, :]).sum(2) * scale
    dq = dq.permute(0, 3, 1, 2, 4).reshape(batch, seqlen_q, heads, head_dim)  # (B, S_q, H, D)
    return dq, dk.permute(0, 2, 1, 3), dv.permute(0, 2, 1, 3)  # dk (B, S_k, H_kv, D), dv (.., D_v)


def torch_backward(dout, q, k, v, out, lse, dlse, cu_q, cu_k, scale, left, right, softcap):
    """Gradients by fp32 recomputation in torch (the documented fallback); same layouts as the kernel."""
    if cu_q is None:
        dq, dk, dv = _torch_backward_batched(dout, q, k, v, out, lse, dlse, scale, left, right, softcap)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for i in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[i], cq[i + 1], ck[i], ck[i + 1]
        if q1 == q0:
            continue
        grads = _torch_backward_batched(
            dout[None, q0:q1], q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], out[None, q0:q1],
            lse[None, :, q0:q1], None if dlse is None else dlse[None, :, q0:q1], scale, left, right, softcap,
        )  # fmt: skip
        dq[q0:q1], dk[k0:k1], dv[k0:k1] = grads[0][0], grads[1][0], grads[2][0]
    return dq, dk, dv
