"""The compiled path's masked op (``hf_flashpatch/backend/masked_op.py``) on CPU: its dense path's
hand-written backward against autograd through its forward (both compute in fp32), and its run-time choice between the plain op and the dense path. Layout
q ``(B, S_q, H, D)``, k ``(B, S_k, H_kv, D)``, v ``(B, S_k, H_kv, D_v)``, key mask ``(B, S_k)``."""

import pytest
import torch

from hf_flashpatch.backend.masked_op import masked_attention_backward, masked_attention_op, masked_attention_with_lse


def _inputs(seqlen_q=7, seqlen_k=7, dtype=torch.float64):
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(2, seqlen_q, 4, 8, generator=gen, dtype=dtype)
    k = torch.randn(2, seqlen_k, 2, 8, generator=gen, dtype=dtype)
    v = torch.randn(2, seqlen_k, 2, 6, generator=gen, dtype=dtype)
    mask = torch.ones(2, seqlen_k, dtype=torch.bool)
    mask[0, :3] = False  # left padding
    mask[1, -2:] = False  # right padding
    return q, k, v, mask


@pytest.mark.parametrize(
    "case",
    [
        dict(causal=True, left=-1, right=-1, softcap=0.0),
        dict(causal=True, left=2, right=-1, softcap=5.0),
        dict(causal=False, left=1, right=1, softcap=0.0),
        dict(causal=True, left=-1, right=-1, softcap=0.0, segments=True),
        dict(causal=False, left=-1, right=-1, softcap=0.0, seqlen_q=3),  # cross-attention
    ],
)
def test_backward_matches_autograd_through_the_dense_path(case):
    case = dict(case)
    segments = case.pop("segments", False)
    q, k, v, mask = _inputs(seqlen_q=case.pop("seqlen_q", 7))
    seg = None
    if segments:
        mask = torch.ones_like(mask)
        seg = torch.tensor([[1, 1, 1, 2, 2, 2, 2], [1, 1, 1, 1, 1, 2, 2]])
    args = (mask, seg, 0.35, case["causal"], case["left"], case["right"], case["softcap"])
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = masked_attention_with_lse(*leaves, *args)
    gen = torch.Generator().manual_seed(6)
    dout = torch.randn(out.shape, generator=gen, dtype=out.dtype)
    dlse = torch.randn(lse.shape, generator=gen, dtype=lse.dtype).masked_fill(torch.isinf(lse), 0.0)
    want = torch.autograd.grad((out, lse), leaves, (dout, dlse))
    got = masked_attention_backward(dout, dlse, q, k, v, *args[:2], out.detach(), lse.detach(), *args[2:])
    for name, g, w in zip("qkv", got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5, msg=name)


def test_the_op_takes_the_plain_path_only_when_every_key_is_real(monkeypatch):
    import hf_flashpatch.kernels.forward as forward

    calls = []
    real = forward.attention_forward
    monkeypatch.setattr(forward, "attention_forward", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    q, k, v, mask = _inputs(dtype=torch.float32)
    args = (None, 0.35, True, -1, -1, 0.0)
    padded, padded_lse = masked_attention_op(q, k, v, mask, *args)
    assert not calls
    torch.testing.assert_close((padded, padded_lse), masked_attention_with_lse(q, k, v, mask, *args))
    assert (padded[0, :3] == 0).all() and torch.isneginf(padded_lse[0, :, :3]).all()  # left-padded rows
    full = torch.ones_like(mask)
    plain, plain_lse = masked_attention_op(q, k, v, full, *args)
    assert calls == [1]
    torch.testing.assert_close((plain, plain_lse), masked_attention_with_lse(q, k, v, full, *args), atol=1e-5,
                               rtol=1e-5)  # fmt: skip


@pytest.mark.parametrize("seed", range(8))
def test_dense_path_is_the_eager_unpadding_on_random_batches(seed):
    """The compiled path's dense computation against the eager backend (unpad, varlen, pad back) on random
    left/right padding, GQA, windows, softcap and fewer queries than keys (a cache prefix)."""
    from hf_flashpatch.backend import attention_forward
    from hf_flashpatch.backend.masked_op import masked_attention

    gen = torch.Generator().manual_seed(seed)
    randint = lambda lo, hi: int(torch.randint(lo, hi, (), generator=gen))  # noqa: E731
    batch, seqlen_k, kv_heads, group = randint(1, 4), randint(2, 12), randint(1, 3), randint(1, 3)
    seqlen_q = seqlen_k if seed % 2 else randint(1, seqlen_k + 1)
    mask = torch.zeros(batch, seqlen_k, dtype=torch.bool)
    for b in range(batch):
        real = randint(seqlen_q if seqlen_q < seqlen_k else 1, seqlen_k + 1)  # a cache row holds its queries
        mask[b, seqlen_k - real :] = True  # left padding
    if seed % 4 == 1 and seqlen_q == seqlen_k:
        mask = mask.flip(1)  # right padding
    window = None if seed % 3 == 0 else (randint(0, 4), None)
    softcap = 5.0 if seed % 3 == 2 else None
    q = torch.randn(batch, kv_heads * group, seqlen_q, 8, generator=gen)  # (B, H, S_q, D), as transformers passes
    k, v = torch.randn(batch, kv_heads, seqlen_k, 8, generator=gen), torch.randn(batch, kv_heads, seqlen_k, 8, generator=gen)
    sliding = None if window is None else window[0] + 1
    eager, _ = attention_forward(torch.nn.Module(), q, k, v, mask, sliding_window=sliding, softcap=softcap)
    dense = masked_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask, causal=True,
                             softmax_scale=None, window=window, softcap=softcap)  # fmt: skip
    torch.testing.assert_close(dense, eager, atol=1e-5, rtol=1e-5)
