"""Shared checks of the forward kernel's GPU tests: random inputs, the launch with a NaN-filled allocator, and the
bound against the fp32 oracle.

Layout: q ``(B, S_q, H, D)``, k/v ``(B, S_k, H_kv, D)`` (varlen: ``(T, H, D)``). The bound, as in flash-attn's tests:
the kernel's max error against the fp32 oracle must be at most twice that of a same-precision torch run (scores,
softmax and P @ V in the input dtype) plus a small eps. The allocator is filled with NaN before every kernel call, so
an output element the kernel never writes shows up as NaN. Imported by GPU test modules only (needs CUDA).
"""

import math

import torch

from hf_flashpatch.kernels.forward import attention_forward
from hf_flashpatch.reference import attention_reference, visibility_mask


def poison_allocator(nbytes: int) -> None:
    """Leave NaN-filled blocks in torch's caching allocator so torch.empty inside the op gets them."""
    blocks = [torch.full((max(nbytes // 4, 1),), float("nan"), device="cuda") for _ in range(3)]
    del blocks


def run_forward(q, k, v, *, causal=False, window=(-1, -1), softcap=None, scale=None, **varlen):
    poison_allocator(q.numel() * q.element_size())
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return attention_forward(q, k, v, causal=causal, softmax_scale=scale, window_left=left, window_right=right,
                             softcap=softcap, **varlen)  # fmt: skip


def lowp_attention(q, k, v, *, causal=False, window=(-1, -1), softcap=None, scale=None):
    """Same-precision torch attention (flash-attn's ``upcast=False`` reference): every op in q's dtype."""
    group = q.shape[2] // k.shape[2]
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    qh = q.transpose(1, 2)  # (B, H, S_q, D)
    kh = k.transpose(1, 2).repeat_interleave(group, dim=1)  # (B, H, S_k, D)
    vh = v.transpose(1, 2).repeat_interleave(group, dim=1)  # (B, H, S_k, D)
    scores = torch.matmul(qh, kh.transpose(-1, -2)) * scale  # (B, H, S_q, S_k), q's dtype
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    visible = visibility_mask(q.shape[1], k.shape[1], left, right, device=q.device)  # (S_q, S_k)
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows that see no key: 0
    return torch.matmul(probs, vh).transpose(1, 2)  # (B, S_q, H, D)


def oracle_attention(q, k, v, *, causal=False, window=(-1, -1), softcap=None, scale=None):
    return attention_reference(q.float(), k.float(), v.float(), causal=causal, window=window, softcap=softcap,
                               softmax_scale=scale)  # fmt: skip


def check_against_oracle(out, lse, q, k, v, **kw):
    """Kernel vs oracle within 2x the same-precision torch error; LSE close; -inf rows match."""
    out_ref, lse_ref = oracle_attention(q, k, v, **kw)
    out_lowp = lowp_attention(q, k, v, **kw)
    assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and lse.dtype == torch.float32
    assert not out.isnan().any(), "unwritten or NaN output elements"
    err = (out.float() - out_ref).abs().max().item()
    err_lowp = (out_lowp.float() - out_ref).abs().max().item()
    assert err <= 2 * err_lowp + 1e-5, f"kernel error {err:.3g} > 2 x same-precision torch error {err_lowp:.3g}"
    unseen = torch.isneginf(lse_ref)
    assert torch.equal(torch.isneginf(lse), unseen), "rows that see no key must have lse = -inf (and only those)"
    torch.testing.assert_close(lse[~unseen], lse_ref[~unseen], atol=1e-3, rtol=1e-3)


def random_qkv(batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim, dtype, transposed=False):
    if transposed:  # transformers' layout: (B, H, S, D) storage viewed as (B, S, H, D)
        q = torch.randn(batch, heads, seqlen_q, head_dim, device="cuda", dtype=dtype).transpose(1, 2)
        k = torch.randn(batch, kv_heads, seqlen_k, head_dim, device="cuda", dtype=dtype).transpose(1, 2)
        v = torch.randn(batch, kv_heads, seqlen_k, head_dim, device="cuda", dtype=dtype).transpose(1, 2)
        return q, k, v
    q = torch.randn(batch, seqlen_q, heads, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(batch, seqlen_k, kv_heads, head_dim, device="cuda", dtype=dtype)
    v = torch.randn(batch, seqlen_k, kv_heads, head_dim, device="cuda", dtype=dtype)
    return q, k, v
