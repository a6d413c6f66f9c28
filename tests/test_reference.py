"""The oracle's own equalities: tiled online softmax == naive, paged == contiguous, merge == whole."""

import pytest
import torch

from hf_flashpatch.reference import (
    SoftmaxState,
    attention_reference,
    attention_tiled,
    paged_decode_reference,
    slot_decode_reference,
    varlen_attention_reference,
    visibility_mask,
)

SHAPES = [(1, 1), (113, 203), (239, 1), (1023, 1024), (64, 37)]
HEADS = {"mha": (4, 4), "gqa": (6, 2), "mqa": (4, 1)}


def _qkv(batch, sq, sk, heads, kv_heads, dim, dtype=torch.float32):
    return (
        torch.randn(batch, sq, heads, dim, dtype=dtype),
        torch.randn(batch, sk, kv_heads, dim, dtype=dtype),
        torch.randn(batch, sk, kv_heads, dim, dtype=dtype),
    )


@pytest.mark.parametrize("sq,sk", SHAPES)
@pytest.mark.parametrize("kind", list(HEADS))
@pytest.mark.parametrize("causal,window,softcap", [(False, None, None), (True, None, None), (True, (31, 0), None),
                                                    (False, (17, 9), 5.0)])
def test_tiled_equals_naive(sq, sk, kind, causal, window, softcap):
    heads, kv_heads = HEADS[kind]
    q, k, v = _qkv(2, sq, sk, heads, kv_heads, 32)
    ref, ref_lse = attention_reference(q, k, v, causal=causal, window=window, softcap=softcap)
    out, lse = attention_tiled(q, k, v, causal=causal, window=window, softcap=softcap, block_m=48, block_n=80)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=2e-5, rtol=1e-5)


def test_naive_matches_textbook_softmax():
    q, k, v = _qkv(1, 5, 7, 2, 2, 8, dtype=torch.float64)
    out, lse = attention_reference(q, k, v, causal=True)
    for h in range(2):
        s = q[0, :, h] @ k[0, :, h].T / 8**0.5  # (5, 7)
        s = s.masked_fill(~torch.ones(5, 7, dtype=torch.bool).tril(2), float("-inf"))
        torch.testing.assert_close(out[0, :, h], torch.softmax(s, -1) @ v[0, :, h])
        torch.testing.assert_close(lse[0, h], torch.logsumexp(s, -1))


def test_bottom_right_causal_and_window_mask():
    mask = visibility_mask(2, 5, left=-1, right=0)
    assert mask.tolist() == [[True, True, True, True, False], [True] * 5]
    mask = visibility_mask(3, 3, left=1, right=0)
    assert mask.tolist() == [[True, False, False], [True, True, False], [False, True, True]]


def test_fully_masked_rows_are_zero_not_nan():
    q, k, v = _qkv(1, 6, 3, 2, 1, 16)
    out, lse = attention_reference(q, k, v, causal=True)  # first 3 queries precede every key
    assert torch.isfinite(out).all()
    assert (out[:, :3] == 0).all() and torch.isinf(lse[:, :, :3]).all()
    out_t, lse_t = attention_tiled(q, k, v, causal=True, block_m=4, block_n=2)
    torch.testing.assert_close(out_t, out)
    torch.testing.assert_close(lse_t, lse)


def test_state_merge_equals_single_pass():
    scores = torch.randn(3, 4, 50)
    values = torch.randn(3, 50, 16)
    whole = SoftmaxState.empty((3, 4), 16)
    whole.update(scores, values)
    a, b = SoftmaxState.empty((3, 4), 16), SoftmaxState.empty((3, 4), 16)
    a.update(scores[..., :20], values[:, :20])
    b.update(scores[..., 20:], values[:, 20:])
    out, lse = a.merge(b).normalize()
    ref_out, ref_lse = whole.normalize()
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1))
    torch.testing.assert_close(out, torch.softmax(scores, -1) @ values)


def test_varlen_equals_per_sequence():
    lens_q, lens_k = [3, 1, 17, 0, 8], [5, 9, 17, 4, 8]
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32)
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32)
    q, k, v = torch.randn(sum(lens_q), 4, 16), torch.randn(sum(lens_k), 2, 16), torch.randn(sum(lens_k), 2, 16)
    out, lse = varlen_attention_reference(q, k, v, cu_q, cu_k, causal=True)
    for i in range(len(lens_q)):
        if lens_q[i] == 0:
            continue
        qs, ks = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        o, l = attention_reference(q[None, qs], k[None, ks], v[None, ks], causal=True)
        torch.testing.assert_close(out[qs], o[0])
        torch.testing.assert_close(lse[:, qs], l[0])


@pytest.mark.parametrize("page_size", [1, 16, 7])
def test_paged_reference_equals_contiguous(page_size):
    batch, heads, kv_heads, dim = 3, 8, 2, 32
    lens = [1, 54, 97]
    max_pages = -(-max(lens) // page_size)
    num_pages = batch * max_pages + 5
    k_pages = torch.randn(num_pages, page_size, kv_heads, dim)
    v_pages = torch.randn(num_pages, page_size, kv_heads, dim)
    table = torch.randperm(num_pages)[: batch * max_pages].reshape(batch, max_pages).int()  # scattered pages
    q = torch.randn(batch, 1, heads, dim)
    out, lse = paged_decode_reference(q, k_pages, v_pages, table, torch.tensor(lens), causal=True)
    for b, n in enumerate(lens):
        k = k_pages[table[b].long()].reshape(-1, kv_heads, dim)[:n]  # (n, H_kv, D)
        v = v_pages[table[b].long()].reshape(-1, kv_heads, dim)[:n]
        o, l = attention_reference(q[b : b + 1], k[None], v[None], causal=True)
        torch.testing.assert_close(out[b : b + 1], o)
        torch.testing.assert_close(lse[b : b + 1], l)
    # the slot form with the same token placement gives the same answer
    slots = torch.cat([(table[b].long()[:, None] * page_size + torch.arange(page_size)).flatten()[:n]
                       for b, n in enumerate(lens)])
    cu = torch.tensor([0, 1, 55, 152])
    out_s, lse_s = slot_decode_reference(q, k_pages.reshape(-1, kv_heads, dim), v_pages.reshape(-1, kv_heads, dim),
                                         slots, cu, causal=True)
    torch.testing.assert_close(out_s, out)
    torch.testing.assert_close(lse_s, lse)
