"""Attention sinks (one logit per query head in every softmax denominator, GPT-OSS) on every API form,
against the fp32 oracle that puts the sink in the softmax as one more column; gradients too, the sinks'
included. CPU (the ops' torch paths); the CUDA kernels return the same ``(out, lse)`` that
:func:`hf_flashpatch.sinks.add_sinks` finishes. Layout (batch, seqlen, heads, head_dim)."""

import pytest
import torch

import hf_flashpatch as hfp
from hf_flashpatch.reference import attention_reference

TOL = dict(atol=2e-5, rtol=2e-5)


def _inputs(batch=2, seqlen_q=7, seqlen_k=11, heads=4, kv_heads=2, head_dim=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seqlen_q, heads, head_dim, generator=gen)
    k = torch.randn(batch, seqlen_k, kv_heads, head_dim, generator=gen)
    v = torch.randn(batch, seqlen_k, kv_heads, head_dim, generator=gen)
    sinks = torch.randn(heads, generator=gen) * 2
    return q, k, v, sinks


def test_oracle_sink_is_a_softmax_column_without_value():
    q, k, v, sinks = _inputs()
    out, lse = attention_reference(q, k, v, causal=True, sinks=sinks)
    plain, plain_lse = attention_reference(q, k, v, causal=True)
    denominator = plain_lse.exp() + sinks[None, :, None].exp()  # (B, H, S_q)
    torch.testing.assert_close(lse, denominator.log(), **TOL)
    torch.testing.assert_close(out, plain * (plain_lse.exp() / denominator).transpose(1, 2)[..., None], **TOL)
    minus_inf = torch.full_like(sinks, float("-inf"))
    torch.testing.assert_close(attention_reference(q, k, v, causal=True, sinks=minus_inf)[0], plain, **TOL)


@pytest.mark.parametrize("causal,window,softcap", [(False, None, None), (True, None, None), (True, (3, 0), 5.0)])
def test_flash_attn_func_with_sinks_matches_the_oracle_and_its_gradients(causal, window, softcap):
    q, k, v, sinks = _inputs()
    leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    out, lse = hfp.flash_attn_func(*leaves[:3], causal=causal, window=window, softcap=softcap, sinks=leaves[3],
                                   return_lse=True)  # fmt: skip
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    want, want_lse = attention_reference(*ref_leaves[:3], causal=causal, window=window, softcap=softcap,
                                         sinks=ref_leaves[3])  # fmt: skip
    torch.testing.assert_close(out, want, **TOL)
    torch.testing.assert_close(lse, want_lse, **TOL)
    grad = torch.randn_like(out)
    (out * grad).sum().backward()
    (want * grad).sum().backward()
    for name, got, ref in zip("qkv", leaves, ref_leaves):
        torch.testing.assert_close(got.grad, ref.grad, atol=1e-4, rtol=1e-4, msg=f"d{name}")
    torch.testing.assert_close(leaves[3].grad, ref_leaves[3].grad, atol=1e-4, rtol=1e-4, msg="dsinks")


def test_varlen_and_kvcache_with_sinks_match_the_oracle():
    q, k, v, sinks = _inputs(batch=1, seqlen_q=9, seqlen_k=9)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    out = hfp.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 5, 5, causal=True, sinks=sinks)
    for start, end in ((0, 4), (4, 9)):
        want, _ = attention_reference(q[:, start:end], k[:, start:end], v[:, start:end], causal=True, sinks=sinks)
        torch.testing.assert_close(out[start:end], want[0], **TOL)
    q1, k_cache, v_cache, sinks = _inputs(batch=3, seqlen_q=1, seqlen_k=12)
    lens = torch.tensor([12, 5, 0], dtype=torch.int32)  # the last row sees no key: zeros, lse = the sink
    out, lse = hfp.flash_attn_with_kvcache(q1, k_cache, v_cache, lens, sinks=sinks, return_lse=True)
    for b, n in enumerate(lens.tolist()):
        if n == 0:
            assert torch.equal(out[b], torch.zeros_like(out[b])) and torch.equal(lse[b, :, 0], sinks)
            continue
        want, want_lse = attention_reference(q1[b : b + 1], k_cache[b : b + 1, :n], v_cache[b : b + 1, :n],
                                             causal=True, sinks=sinks)  # fmt: skip
        torch.testing.assert_close(out[b : b + 1], want, **TOL)
        torch.testing.assert_close(lse[b : b + 1], want_lse, **TOL)


@pytest.mark.parametrize(
    "sinks,match",
    [([0.0] * 4, "torch.Tensor"), (torch.zeros(3), r"shape \(4,\)"), (torch.zeros(4, dtype=torch.int64), "floating")],
)
def test_bad_sinks_name_what_was_received(sinks, match):
    q, k, v, _ = _inputs()
    with pytest.raises((TypeError, ValueError), match=match):
        hfp.flash_attn_func(q, k, v, sinks=sinks)


def test_backend_paths_with_sinks_eager_and_compiled():
    """The transformers backend with ``s_aux``: eager (padded batch through varlen, decode over a cache) and
    the compiled forms (the batched op; the exact masked path) against the oracle per row."""
    from hf_flashpatch.backend import attention_forward
    from hf_flashpatch.backend.masked_op import masked_attention
    from hf_flashpatch.backend.traced import traced_attention

    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 6, 8, generator=gen)  # (B, H, S, D), as transformers passes them
    k, v = torch.randn(2, 2, 6, 8, generator=gen), torch.randn(2, 2, 6, 8, generator=gen)
    sinks = torch.randn(4, generator=gen)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)  # (B, S): row 0 left-padded
    eager, _ = attention_forward(torch.nn.Module(), q, k, v, mask, s_aux=sinks)  # (B, S, H, D)
    for b, first in ((0, 2), (1, 0)):
        want, _ = attention_reference(q.transpose(1, 2)[b : b + 1, first:], k.transpose(1, 2)[b : b + 1, first:],
                                      v.transpose(1, 2)[b : b + 1, first:], causal=True, sinks=sinks)  # fmt: skip
        torch.testing.assert_close(eager[b : b + 1, first:], want, **TOL)
    assert (eager[0, :2] == 0).all()
    attn = dict(causal=True, softmax_scale=None, window=None, softcap=None, sinks=sinks)
    dense = masked_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask, **attn)
    torch.testing.assert_close(dense, eager, **TOL)
    compiled = torch.compile(lambda q, k, v: traced_attention(q, k, v, None, None, None, attn, False),
                             fullgraph=True, backend="aot_eager")  # fmt: skip
    want, _ = attention_reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True, sinks=sinks)
    torch.testing.assert_close(compiled(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)), want, **TOL)
    one = q[:, :, -1:].transpose(1, 2)  # (B, 1, H, D): one new token over the 6 keys, the decode op
    step = torch.compile(lambda q, k, v, m: traced_attention(q, k, v, m, None, None, attn, False), fullgraph=True,
                         backend="aot_eager")  # fmt: skip
    got = step(one, k.transpose(1, 2), v.transpose(1, 2), mask)
    for b, first in ((0, 2), (1, 0)):
        want, _ = attention_reference(one[b : b + 1], k.transpose(1, 2)[b : b + 1, first:],
                                      v.transpose(1, 2)[b : b + 1, first:], causal=True, sinks=sinks)  # fmt: skip
        torch.testing.assert_close(got[b : b + 1], want, **TOL)
