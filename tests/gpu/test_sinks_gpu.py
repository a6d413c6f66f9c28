"""Attention sinks on the CUDA kernels (forward, backward, decode) against the fp32 oracle.

Layout q ``(B, S_q, H, D)``, k/v ``(B, S_k, H_kv, D)``, sinks ``(H,)``. The bound, as in the other GPU tests:
at most twice the error of a same-precision torch run against the same oracle, plus a small eps. The
same-precision run is the oracle computed from the bf16 inputs with bf16 matmuls (sdpa with the sink as an
extra key column of zero value is not available, so the sink column is added by hand).
"""

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("pycuda")

import hf_flashpatch as hfp  # noqa: E402
from hf_flashpatch.reference import attention_reference  # noqa: E402

DEV = "cuda"


def _same_precision(q, k, v, sinks, causal):
    """The attention with the sink column, computed in the inputs' dtype (the error budget's yardstick)."""
    group = q.shape[2] // k.shape[2]
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, S, D)
    kt, vt = kt.repeat_interleave(group, 1), vt.repeat_interleave(group, 1)
    scores = (qt @ kt.transpose(-1, -2)) * q.shape[-1] ** -0.5  # (B, H, S_q, S_k), in q's dtype
    if causal:
        offset = k.shape[1] - q.shape[1]
        keep = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool, device=q.device).tril(offset)
        scores = scores.masked_fill(~keep, float("-inf"))
    column = sinks.to(q.dtype)[None, :, None, None].expand(*scores.shape[:3], 1)
    probs = torch.softmax(torch.cat([scores, column], -1), -1)[..., :-1]  # (B, H, S_q, S_k)
    return (probs @ vt).transpose(1, 2)


@pytest.mark.parametrize("seqlens", [(113, 203), (1023, 1024), (1, 517)])
@pytest.mark.parametrize("heads", [(8, 8), (8, 2), (8, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_forward_and_decode_with_sinks(seqlens, heads, head_dim):
    torch.manual_seed(0)
    (seqlen_q, seqlen_k), (h, h_kv) = seqlens, heads
    q = torch.randn(2, seqlen_q, h, head_dim, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(2, seqlen_k, h_kv, head_dim, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(2, seqlen_k, h_kv, head_dim, device=DEV, dtype=torch.bfloat16)
    sinks = torch.randn(h, device=DEV) * 2
    out = hfp.flash_attn_func(q, k, v, causal=True, sinks=sinks)  # decode kernel when seqlen_q == 1
    want, _ = attention_reference(q.float(), k.float(), v.float(), causal=True, sinks=sinks)
    base = (_same_precision(q, k, v, sinks, True).float() - want).abs().max().item()
    err = (out.float() - want).abs().max().item()
    assert torch.isfinite(out).all() and err <= 2 * base + 1e-3, (err, base)


def test_backward_with_sinks_matches_the_oracle():
    torch.manual_seed(1)
    q = torch.randn(2, 239, 8, 128, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 239, 2, 128, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(2, 239, 2, 128, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    sinks = (torch.randn(8, device=DEV) * 2).requires_grad_()
    grad = torch.randn(2, 239, 8, 128, device=DEV, dtype=torch.bfloat16)
    out = hfp.flash_attn_func(q, k, v, causal=True, sinks=sinks)
    got = torch.autograd.grad(out, (q, k, v, sinks), grad)
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v, sinks)]
    want, _ = attention_reference(*leaves[:3], causal=True, sinks=leaves[3])
    wants = torch.autograd.grad(want, leaves, grad.float())
    low = [t.detach().requires_grad_() for t in (q, k, v)] + [sinks.detach().requires_grad_()]
    base_out = _same_precision(*low[:3], low[3], True)
    bases = torch.autograd.grad(base_out, low, grad)
    for name, g, w, b in zip(["dq", "dk", "dv", "dsinks"], got, wants, bases):
        err = (g.float() - w).abs().max().item()
        base = (b.float() - w).abs().max().item()
        assert err <= 2 * base + 1e-3, (name, err, base)
