"""Inputs and gradients shared by the CPU tests of a value head dim of its own (``D_v != D``).

Layout (batch, seqlen, heads, head_dim): q ``(B, S_q, H, D)``, k ``(B, S_k, H_kv, D)``, v ``(B, S_k, H_kv, D_v)``;
packed: ``(T, H, D)``.
"""

import torch

TOL = dict(atol=2e-5, rtol=2e-5)
GRAD_TOL = dict(atol=1e-4, rtol=1e-4)


def random_qkv(batch=2, seqlen_q=9, seqlen_k=13, heads=4, kv_heads=2, dims=(24, 16), seed=0, packed=False):
    gen = torch.Generator().manual_seed(seed)
    head_dim, head_dim_v = dims
    lead_q, lead_k = ((batch * seqlen_q,), (batch * seqlen_k,)) if packed else ((batch, seqlen_q), (batch, seqlen_k))
    q = torch.randn(*lead_q, heads, head_dim, generator=gen)
    k = torch.randn(*lead_k, kv_heads, head_dim, generator=gen)
    v = torch.randn(*lead_k, kv_heads, head_dim_v, generator=gen)
    return q, k, v


def grad_leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


def cotangent_grads(outputs, inputs, seed=5):
    """Gradients of ``sum(out * g)`` (+ ``sum(lse * g_lse)``) with fixed random cotangents."""
    gen = torch.Generator().manual_seed(seed)
    cotangents = [torch.randn(o.shape, generator=gen) for o in outputs]
    return torch.autograd.grad(outputs, inputs, cotangents)
