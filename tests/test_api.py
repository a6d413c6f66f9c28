"""Public API on CPU (the torch fallback) against the oracle, and its input errors."""

import pytest
import torch

import hf_flashpatch as hfp
from hf_flashpatch.reference import attention_reference, paged_decode_reference, varlen_attention_reference


def _qkv(b, sq, sk, h, hk, d, dtype=torch.float32, requires_grad=False):
    make = lambda *s: torch.randn(*s, dtype=dtype, requires_grad=requires_grad)  # noqa: E731
    return make(b, sq, h, d), make(b, sk, hk, d), make(b, sk, hk, d)


@pytest.mark.parametrize("sq,sk", [(1, 1), (113, 203), (239, 1), (64, 64)])
@pytest.mark.parametrize("h,hk", [(4, 4), (6, 2), (4, 1)])
@pytest.mark.parametrize("causal,window,softcap", [(False, None, None), (True, None, None), (True, (15, 0), None),
                                                    (True, None, 30.0)])
def test_flash_attn_func_matches_oracle(sq, sk, h, hk, causal, window, softcap):
    q, k, v = _qkv(2, sq, sk, h, hk, 32)
    out, lse = hfp.flash_attn_func(q, k, v, causal=causal, window=window, softcap=softcap, return_lse=True)
    ref, ref_lse = attention_reference(q, k, v, causal=causal, window=window, softcap=softcap)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)
    plain = hfp.flash_attn_func(q, k, v, causal=causal, window=window, softcap=softcap)
    torch.testing.assert_close(plain, ref, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(plain).all()


def test_strided_transposed_inputs():
    q = torch.randn(2, 4, 50, 32).transpose(1, 2)  # (B, S, H, D) view of a (B, H, S, D) tensor
    k = torch.randn(2, 2, 70, 32).transpose(1, 2)
    v = torch.randn(2, 2, 70, 32).transpose(1, 2)
    torch.testing.assert_close(hfp.flash_attn_func(q, k, v, causal=True),
                               attention_reference(q, k, v, causal=True)[0], atol=1e-5, rtol=1e-5)


def test_gradients_flow_through_fallback():
    q, k, v = _qkv(1, 9, 13, 4, 2, 16, requires_grad=True)
    hfp.flash_attn_func(q, k, v, causal=True).square().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    attention_reference(q, k, v, causal=True)[0].square().sum().backward()
    for g, t in zip(grads, (q, k, v)):
        torch.testing.assert_close(g, t.grad, atol=1e-5, rtol=1e-4)


def test_varlen_matches_oracle():
    lens = [5, 1, 33, 12]
    cu = torch.tensor([0, 5, 6, 39, 51], dtype=torch.int32)
    q, k, v = torch.randn(51, 6, 32), torch.randn(51, 2, 32), torch.randn(51, 2, 32)
    out, lse = hfp.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True, return_lse=True)
    ref, ref_lse = varlen_attention_reference(q, k, v, cu, cu, causal=True)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)


def test_kvcache_respects_per_row_lengths():
    q = torch.randn(3, 1, 8, 32)
    k_cache, v_cache = torch.randn(3, 40, 2, 32), torch.randn(3, 40, 2, 32)
    k_cache[1, 20:] = float("nan")  # past the valid length: must never be read
    lens = torch.tensor([40, 20, 7], dtype=torch.int32)
    out = hfp.flash_attn_with_kvcache(q, k_cache, v_cache, lens)
    for b, n in enumerate(lens.tolist()):
        ref, _ = attention_reference(q[b : b + 1], k_cache[b : b + 1, :n], v_cache[b : b + 1, :n], causal=True)
        torch.testing.assert_close(out[b : b + 1], ref, atol=1e-5, rtol=1e-5)


def test_paged_decode_matches_reference():
    pages_k, pages_v = torch.randn(20, 16, 2, 32), torch.randn(20, 16, 2, 32)
    table = torch.tensor([[3, 9, 0], [17, 4, 11]], dtype=torch.int32)
    lens = torch.tensor([40, 33], dtype=torch.int32)
    q = torch.randn(2, 1, 8, 32)
    out = hfp.flash_attn_paged_decode(q, pages_k, pages_v, table, lens)
    ref, _ = paged_decode_reference(q, pages_k, pages_v, table, lens, causal=True)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: (torch.randn(2, 8, 4), torch.randn(2, 8, 4), torch.randn(2, 8, 4)), r"4-D .*got shape \(2, 8, 4\)"),
        (lambda: (torch.randn(1, 8, 4, 16).int(), torch.randn(1, 8, 4, 16), torch.randn(1, 8, 4, 16)), "torch.int32"),
        (lambda: (torch.randn(1, 8, 6, 16), torch.randn(1, 8, 4, 16), torch.randn(1, 8, 4, 16)), "6 q heads and 4 kv"),
        (lambda: (torch.randn(1, 8, 4, 16), torch.randn(1, 8, 4, 32), torch.randn(1, 8, 4, 32)), "same head_dim"),
        (lambda: (torch.randn(1, 8, 4, 512), torch.randn(1, 8, 4, 512), torch.randn(1, 8, 4, 512)), "got 512"),
        (lambda: (torch.randn(2, 8, 4, 16), torch.randn(1, 8, 4, 16), torch.randn(1, 8, 4, 16)), "same batch"),
        (lambda: (torch.randn(1, 8, 4, 16), torch.randn(1, 8, 4, 16), torch.randn(1, 9, 4, 16)), "same shape"),
        (lambda: (torch.randn(1, 8, 4, 16).half(), torch.randn(1, 8, 4, 16), torch.randn(1, 8, 4, 16)), "share a dtype"),
    ],
)
def test_bad_input_errors_name_what_was_received(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        hfp.flash_attn_func(*make())


def test_bad_varlen_and_page_inputs():
    q, k, v = torch.randn(10, 4, 16), torch.randn(10, 2, 16), torch.randn(10, 2, 16)
    with pytest.raises(TypeError, match="float32"):
        hfp.flash_attn_varlen_func(q, k, v, torch.tensor([0.0, 10.0]), torch.tensor([0, 10]), 10, 10)
    with pytest.raises(ValueError, match="same number of sequences"):
        hfp.flash_attn_varlen_func(q, k, v, torch.tensor([0, 10]), torch.tensor([0, 5, 10]), 10, 10)
    with pytest.raises(ValueError, match=r"page_table must be \(2, max_pages\), got \(3, 4\)"):
        hfp.flash_attn_paged_decode(torch.randn(2, 1, 4, 16), torch.randn(8, 4, 2, 16), torch.randn(8, 4, 2, 16),
                                    torch.zeros(3, 4, dtype=torch.int32), torch.tensor([3, 3]))
