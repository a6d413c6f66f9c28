"""Edge inputs found by the 2026-12-04 review of the public API, on CPU: each gets a clear error naming what was
received, or the defined result. Layout (batch, seqlen, heads, head_dim); varlen (total, heads, head_dim)."""

import pytest
import torch

import hf_flashpatch as hfp
from hf_flashpatch.reference import attention_reference


def _paged(head_dim=16, batch=2):
    q = torch.randn(batch, 1, 4, head_dim)
    pages = torch.randn(6, 4, 2, 16)
    table = torch.tensor([[3, 1, 0], [5, 2, 4]], dtype=torch.int32)[:batch]
    return q, pages, pages.clone(), table, torch.tensor([9, 12], dtype=torch.int32)[:batch]


def test_an_infinite_key_reaches_only_the_rows_that_see_it():
    """The sdpa path added the causal mask to an inf (NaN) score: every row turned NaN."""
    q, k, v = (torch.randn(1, 4, 1, 8) for _ in range(3))
    k[:, -1] = float("inf")
    out = hfp.flash_attn_func(q, k, v, causal=True)
    out_lse, _ = hfp.flash_attn_func(q, k, v, causal=True, return_lse=True)
    ref = attention_reference(q, k, v, causal=True)[0]
    assert torch.isfinite(out[:, :3]).all()  # rows 0-2 do not see the last key
    torch.testing.assert_close(out, out_lse, equal_nan=True)
    torch.testing.assert_close(out, ref, equal_nan=True)


def test_finite_scores_past_fp32_reach_only_the_rows_that_see_them():
    """Finite q and k whose score overflows fp32 (1e20 x 1e20): sdpa added the causal mask to that inf score and
    turned the row that does not see it NaN too; the path taken now masks before the softmax, as the oracle."""
    q, k = torch.tensor([1e20, 1e20]).view(1, 2, 1, 1), torch.tensor([1.0, 1e20]).view(1, 2, 1, 1)
    v = torch.tensor([3.0, 5.0]).view(1, 2, 1, 1)
    out = hfp.flash_attn_func(q, k, v, causal=True, softmax_scale=1.0)
    ref = attention_reference(q, k, v, causal=True, softmax_scale=1.0)[0]
    assert out[0, 0, 0, 0] == 3.0  # row 0 sees key 0 only
    torch.testing.assert_close(out, ref, equal_nan=True)
    cached = hfp.flash_attn_with_kvcache(q, k, v, causal=True, softmax_scale=1.0)
    torch.testing.assert_close(cached, ref, equal_nan=True)


def test_check_inputs_must_be_a_bool_everywhere():
    q, pk, pv, pt, lens = _paged()
    with pytest.raises(TypeError, match="check_inputs must be a bool, got str 'no'"):
        hfp.flash_attn_paged_decode(q, pk, pv, pt, lens, check_inputs="no")
    with pytest.raises(TypeError, match="check_inputs must be a bool, got NoneType None"):
        hfp.flash_attn_with_kvcache(q, q, q, check_inputs=None)


def test_cache_and_pool_errors_use_the_callers_names():
    q = torch.randn(2, 1, 4, 16)
    with pytest.raises(ValueError, match=r"q and k_cache must have the same batch, got \(2, 1, 4, 16\) and \(3, 9, 2"):
        hfp.flash_attn_with_kvcache(q, torch.randn(3, 9, 2, 16), torch.randn(3, 9, 2, 16))
    cu = torch.tensor([0, 1, 2], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"k_pool must be 3-D \(total, heads, head_dim\), got shape \(40, 32\)"):
        hfp.flash_attn_slot_varlen_func(q[:, 0], torch.randn(40, 32), torch.randn(40, 32), torch.tensor([0, 1]), cu,
                                        cu, 1, 1)  # fmt: skip


def test_sparse_inputs_are_refused_by_layout():
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(TypeError, match="q must be a dense \\(strided\\) tensor, got layout torch.sparse_coo"):
        hfp.flash_attn_func(q.to_sparse(), q, q)


def test_paged_value_head_dim_errors_name_the_pools():
    q, pk, pv, pt, lens = _paged()
    wide = torch.randn(*pv.shape[:-1], 300)
    with pytest.raises(ValueError, match=r"got 300 \(v_pages' head_dim; .* v_pages \(6, 4, 2, 300\)"):
        hfp.flash_attn_paged_decode(q, pk, wide, pt, lens)


@pytest.mark.parametrize("kwargs", [dict(softcap=30.0), dict(return_lse=True), dict(sinks=torch.zeros(4))])
def test_outputs_are_contiguous_on_every_path(kwargs):
    q = k = v = torch.randn(2, 5, 4, 16)
    res = hfp.flash_attn_func(q, k, v, **kwargs)
    out = res[0] if isinstance(res, tuple) else res
    assert out.is_contiguous()
    assert out.view(2, 5, -1).shape == (2, 5, 64)
    res = hfp.flash_attn_with_kvcache(q[:, :1], k, v, torch.tensor([5, 3], dtype=torch.int32), **kwargs)
    assert (res[0] if isinstance(res, tuple) else res).is_contiguous()


def test_no_keys_with_lse_keeps_the_autograd_graph():
    """The tiled path visits no tile when there is no key; its zeros used to leave the graph."""
    q = torch.randn(1, 3, 2, 8, requires_grad=True)
    k = v = torch.randn(1, 0, 2, 8)
    out, lse = hfp.flash_attn_func(q, k, v, return_lse=True)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()
    out.sum().backward()
    assert torch.equal(q.grad, torch.zeros_like(q))
    q2 = torch.randn(2, 1, 2, 8, requires_grad=True)
    cache = torch.randn(2, 4, 2, 8)
    out, _ = hfp.flash_attn_with_kvcache(q2, cache, cache, torch.zeros(2, dtype=torch.int32), return_lse=True)
    out.sum().backward()
    assert torch.equal(q2.grad, torch.zeros_like(q2))


def test_varlen_padding_rows_keep_minus_inf_lse_with_sinks():
    q, k = torch.randn(6, 2, 8), torch.randn(6, 2, 8)
    cu = torch.tensor([0, 2, 4], dtype=torch.int32)
    sinks = torch.tensor([0.5, -1.0])
    out, lse = hfp.flash_attn_varlen_func(q, k, k, cu, cu, 2, 2, return_lse=True, sinks=sinks)
    assert torch.isneginf(lse[:, 4:]).all() and torch.equal(out[4:], torch.zeros_like(out[4:]))
    _, plain = hfp.flash_attn_varlen_func(q, k, k, cu, cu, 2, 2, return_lse=True)
    torch.testing.assert_close(lse[:, :4], torch.logaddexp(plain[:, :4], sinks[:, None]))


@pytest.mark.parametrize("grad", [False, True])
def test_varlen_rows_past_the_last_sequence_are_zero_where_the_tables_were_checked(monkeypatch, grad):
    """The kernels write no row past ``cu_seqlens_q[-1]`` (flash-attn's behaviour); where the call checked its
    tables (CPU tables always, CUDA ones unless ``check_inputs=False``), those rows come back 0 with lse ``-inf``,
    as on the torch path, also for an autograd output; the sequences' rows are the kernel's, untouched."""
    from hf_flashpatch import api, fallback

    q, k, v = torch.randn(9, 4, 16, requires_grad=grad), torch.randn(9, 2, 16), torch.randn(9, 2, 16)
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)  # rows 7 and 8: no sequence's
    common = dict(causal=True, window=None, softmax_scale=None, softcap=None, return_lse=True)
    want, want_lse = fallback.varlen_attention(q, k, v, cu, cu, **common)
    unwritten = torch.arange(9) >= 7  # (T_q,)
    kernel_result = (want.masked_fill(unwritten[:, None, None], float("nan")),
                     want_lse.masked_fill(unwritten, float("nan")))  # fmt: skip
    monkeypatch.setattr(api, "_kernel_call", lambda q_, run: kernel_result)  # what the kernels give
    out, lse = hfp.flash_attn_varlen_func(q, k, v, cu, cu, 4, 4, causal=True, return_lse=True)
    assert torch.equal(out[7:], torch.zeros_like(out[7:])) and torch.isneginf(lse[:, 7:]).all()
    assert torch.equal(out[:7], want[:7]) and torch.equal(lse[:, :7], want_lse[:, :7])
    if grad:
        out.sum().backward()
        assert torch.equal(q.grad[7:], torch.zeros_like(q.grad[7:])) and torch.isfinite(q.grad).all()
    with torch.no_grad():
        slot_out = hfp.flash_attn_slot_varlen_func(q, k, v, torch.arange(9), cu, cu, 4, 4, causal=True)
    assert torch.equal(slot_out[7:], torch.zeros_like(slot_out[7:])) and torch.equal(slot_out[:7], want[:7])


@pytest.mark.parametrize("table", ["cache_seqlens", "page_table", "seqlens_k"])
def test_index_tables_on_another_device_are_named(table):
    if table == "cache_seqlens":
        q, cache = torch.randn(3, 1, 4, 32), torch.randn(3, 8, 2, 32)
        call = lambda: hfp.flash_attn_with_kvcache(  # noqa: E731
            q, cache, cache, torch.tensor([1, 0, 2], dtype=torch.int32, device="meta"))
    else:
        q, pk, pv, pt, lens = _paged()
        pt, lens = (pt.to("meta"), lens) if table == "page_table" else (pt, lens.to("meta"))
        call = lambda: hfp.flash_attn_paged_decode(q, pk, pv, pt, lens)  # noqa: E731
    with pytest.raises(ValueError, match=f"{table} must be on the cpu, got meta"):
        call()


def test_meta_tensors_give_shapes_only_as_torch_does():
    """Shape inference (a model moved to the meta device) used to crash reading a mask's values."""
    q, k, v = torch.empty(2, 4, 4, 8, device="meta"), torch.empty(2, 6, 2, 8, device="meta"), torch.empty(2, 6, 2, 5, device="meta")
    out, lse = hfp.flash_attn_func(q, k, v, causal=True, return_lse=True)
    assert out.device.type == "meta" and out.shape == (2, 4, 4, 5) and lse.shape == (2, 4, 4)
    cu = torch.tensor([0, 3, 4], dtype=torch.int32, device="meta")
    out, lse = hfp.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 3, 3, causal=True, return_lse=True)
    assert out.shape == (4, 4, 5) and lse.shape == (4, 4)
    assert hfp.flash_attn_with_kvcache(q[:, :1], k, v).shape == (2, 1, 4, 5)


def test_paged_decode_errors_name_the_pools():
    q, pk, pv, pt, lens = _paged(head_dim=32)
    with pytest.raises(ValueError, match=r"q and k_pages must have the same head_dim .* k_pages \(6, 4, 2, 16\)"):
        hfp.flash_attn_paged_decode(q, pk, pv, pt, lens)
    q, pk, pv, pt, lens = _paged()
    with pytest.raises(TypeError, match="q, k_pages, v_pages must share a dtype, got torch.float32, torch.float64"):
        hfp.flash_attn_paged_decode(q, pk.double(), pv.double(), pt, lens)
    with pytest.raises(ValueError, match=r"k_pages/v_pages heads \(dim 2\) must divide q's heads"):
        hfp.flash_attn_paged_decode(torch.randn(2, 1, 3, 16), pk, pv, pt, lens)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(softmax_scale=1e308), ValueError, "softmax_scale must be finite in fp32"),
        (dict(window=(2**64, 0)), ValueError, r"window left must be -1/None \(unbounded\) or in 0..2\*\*31-1, got 18"),
        (dict(window=(-5, 0)), ValueError, r"window left must be -1/None \(unbounded\) .* got -5 in window=\(-5,"),
        (dict(window=(2, -3)), ValueError, r"window right must be .* got -3 in window=\(2, -3\)"),
        (dict(causal="no"), TypeError, "causal must be a bool, got str 'no'"),
        (dict(return_lse="no"), TypeError, "return_lse must be a bool, got str 'no'"),
        (dict(deterministic="x"), TypeError, "deterministic must be a bool, got str 'x'"),
    ],
)
def test_scalars_out_of_range_are_errors(kwargs, error, match):
    q, k, v = torch.randn(1, 5, 2, 8), torch.randn(1, 5, 2, 8), torch.randn(1, 5, 2, 8)
    with pytest.raises(error, match=match):
        hfp.flash_attn_func(q, k, v, **kwargs)


def test_a_softcap_past_fp32_range_means_no_cap():
    q, k, v = torch.randn(1, 5, 2, 8), torch.randn(1, 5, 2, 8), torch.randn(1, 5, 2, 8)
    torch.testing.assert_close(hfp.flash_attn_func(q, k, v, softcap=1e39), hfp.flash_attn_func(q, k, v))
