"""Invalid index tables, NaN inputs and edge-case scalars on a real GPU (issue 18, items 4-8).

Two contracts for tables (``cu_seqlens``, page tables, lengths, slots), see hf_flashpatch/api.py:

- eager mode with checks on (the default): a clear ValueError naming the entry;
- ``check_inputs=False`` (or compile / graph capture): no out-of-bounds access. Every table read in
  the kernels is clamped, so the result equals the call with the clamped table. The tensors the
  kernels read are views into buffers with NaN padding on both sides (an out-of-bounds read shows up
  as NaN in the output), and the pools written by kv_append sit between sentinel rows that must stay
  unchanged. Run this file once under ``compute-sanitizer --tool memcheck`` as well.

Layout (batch, seqlen, heads, head_dim); varlen (total, heads, head_dim).
"""

import math

import pytest
import torch

import hf_flashpatch as hfp

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("pycuda")

from hf_flashpatch.kernels import decode  # noqa: E402
from hf_flashpatch.reference import attention_reference  # noqa: E402

DEV = "cuda"
BF16 = torch.bfloat16
NAN = float("nan")
PAD = 3  # NaN rows on each side of every padded tensor


def _padded(shape, dim=0, dtype=BF16):
    """Random ``shape`` viewed inside a buffer with PAD NaN slices on each side along ``dim``:
    ``(view, buffer)``. A kernel reading past either end of the view reads NaN."""
    full = list(shape)
    full[dim] += 2 * PAD
    buffer = torch.full(full, NAN, dtype=dtype, device=DEV)
    view = buffer.narrow(dim, PAD, shape[dim])
    view.copy_(torch.randn(shape, dtype=dtype, device=DEV))
    return view, buffer


def _int(values, dtype=torch.int32):
    return torch.tensor(values, dtype=dtype, device=DEV)


# ------------------------------------------------------------------------------------ varlen forward


VARLEN_BAD = {
    # cu_seqlens_q, cu_seqlens_k, the clamped tables the kernel must behave as (None: no defined result)
    "unsorted": ([0, 8, 4, 12], [0, 8, 4, 12], None),
    "starts_at_2": ([2, 6, 10, 12], [2, 6, 10, 12], None),
    "negative_start": ([-4, 4, 8, 12], [-4, 4, 8, 12], ([0, 4, 8, 12], [0, 4, 8, 12])),
    "k_past_total": ([0, 4, 8, 12], [0, 4, 8, 20], ([0, 4, 8, 12], [0, 4, 8, 12])),
    "q_past_total": ([0, 4, 8, 14], [0, 4, 8, 12], ([0, 4, 8, 12], [0, 4, 8, 12])),
    "far_out": ([0, 4, 1 << 30, -(1 << 30)], [0, -7, 1 << 30, 12], None),
}


def _varlen_inputs(total=12, heads=4, kv_heads=2, head_dim=64):
    q, q_buf = _padded((total, heads, head_dim))
    k, k_buf = _padded((total, kv_heads, head_dim))
    v, v_buf = _padded((total, kv_heads, head_dim))
    return q, k, v


@pytest.mark.parametrize("case", list(VARLEN_BAD))
def test_varlen_invalid_tables_raise_in_eager_mode(case):
    cu_q, cu_k, _ = VARLEN_BAD[case]
    q, k, v = _varlen_inputs()
    with pytest.raises(ValueError, match="cu_seqlens_[qk]"):
        hfp.flash_attn_varlen_func(q, k, v, _int(cu_q), _int(cu_k), 16, 16, causal=True)


@pytest.mark.parametrize("case", list(VARLEN_BAD))
def test_varlen_unchecked_tables_stay_in_bounds(case):
    cu_q, cu_k, clamped = VARLEN_BAD[case]
    q, k, v = (t.requires_grad_() for t in _varlen_inputs())
    out, lse = hfp.flash_attn_varlen_func(q, k, v, _int(cu_q), _int(cu_k), 16, 16, causal=True, return_lse=True,
                                          check_inputs=False)  # fmt: skip
    out.float().sum().backward()  # the backward kernels read the same tables
    torch.cuda.synchronize()  # an illegal address would raise here
    for grad in (q.grad, k.grad, v.grad):
        assert torch.isfinite(grad).all(), "a gradient read NaN padding (out of bounds) or is unwritten"
    if clamped is not None:
        expect, expect_lse = hfp.flash_attn_varlen_func(q, k, v, _int(clamped[0]), _int(clamped[1]), 16, 16,
                                                        causal=True, return_lse=True)  # fmt: skip
        assert torch.equal(out, expect) and torch.equal(lse, expect_lse)
    elif case == "unsorted":  # spans [0, 8), [8, 8), [4, 12): every row written, none read out of bounds
        assert torch.isfinite(out).all()


# ------------------------------------------------------------------------------------ paged decode


def _paged_inputs(batch=3, num_pages=10, page_size=16, heads=8, kv_heads=2, head_dim=128):
    q = torch.randn(batch, 1, heads, head_dim, device=DEV, dtype=BF16)
    k_pages, _ = _padded((num_pages, page_size, kv_heads, head_dim))
    v_pages, _ = _padded((num_pages, page_size, kv_heads, head_dim))
    table = _int([[3, 7, 1], [0, 9, 2], [5, 4, 8]][:batch])
    lens = _int([40, 33, 48][:batch])
    return q, k_pages, v_pages, table, lens


PAGED_BAD = {
    # (row, column, page id) written into the table, (row, length) into seqlens_k, and what the kernel clamps to
    "page_minus_one": ((0, 1, -1), None, ((0, 1, 0), None)),
    "page_past_pool": ((1, 2, 10), None, ((1, 2, 0), None)),
    "page_huge": ((2, 0, 1 << 30), None, ((2, 0, 0), None)),
    "length_past_table": (None, (1, 999), (None, (1, 48))),
    "length_negative": (None, (2, -5), (None, (2, 0))),
}


def _apply(table, lens, page, length):
    table, lens = table.clone(), lens.clone()
    if page is not None:
        table[page[0], page[1]] = page[2]
    if length is not None:
        lens[length[0]] = length[1]
    return table, lens


@pytest.mark.parametrize("case", list(PAGED_BAD))
def test_paged_invalid_tables_raise_in_eager_mode(case):
    q, k_pages, v_pages, table, lens = _paged_inputs()
    page, length, _ = PAGED_BAD[case]
    table, lens = _apply(table, lens, page, length)
    with pytest.raises(ValueError, match=r"page_table\[|seqlens_k\[|page_table has only"):
        hfp.flash_attn_paged_decode(q, k_pages, v_pages, table, lens)


@pytest.mark.parametrize("case", list(PAGED_BAD))
def test_paged_unchecked_tables_stay_in_bounds(case):
    q, k_pages, v_pages, table, lens = _paged_inputs()
    page, length, (clamped_page, clamped_length) = PAGED_BAD[case]
    bad_table, bad_lens = _apply(table, lens, page, length)
    out, lse = hfp.flash_attn_paged_decode(q, k_pages, v_pages, bad_table, bad_lens, return_lse=True,
                                           check_inputs=False)  # fmt: skip
    torch.cuda.synchronize()
    assert not torch.isnan(out).any(), "read the NaN padding around the pools (out of bounds)"
    good_table, good_lens = _apply(table, lens, clamped_page, clamped_length)
    expect, expect_lse = hfp.flash_attn_paged_decode(q, k_pages, v_pages, good_table, good_lens, return_lse=True)
    assert torch.equal(out, expect) and torch.equal(lse, expect_lse)


def test_kvcache_lengths_raise_or_clamp():
    q = torch.randn(2, 1, 8, 128, device=DEV, dtype=BF16)
    k, _ = _padded((2, 64, 2, 128), dim=1)  # reads past S_cache would hit NaN
    v, _ = _padded((2, 64, 2, 128), dim=1)
    for bad in (-3, 999):
        with pytest.raises(ValueError, match=rf"cache_seqlens\[1\] = {bad} is outside \[0, 64\]"):
            hfp.flash_attn_with_kvcache(q, k, v, _int([10, bad]))
    out, lse = hfp.flash_attn_with_kvcache(q, k, v, _int([10, -3]), return_lse=True, check_inputs=False)
    assert (out[1] == 0).all() and (lse[1] == -math.inf).all()  # a negative length is 0 keys
    out, lse = hfp.flash_attn_with_kvcache(q, k, v, _int([10, 999]), return_lse=True, check_inputs=False)
    expect, expect_lse = hfp.flash_attn_with_kvcache(q, k, v, _int([10, 64]), return_lse=True)
    assert torch.equal(out, expect) and torch.equal(lse, expect_lse)


def test_slot_decode_clamps_slots_and_cu_seqlens():
    """The slot form (transformers' continuous batching, no host checks): slots outside the pool read
    slot 0, cu_seqlens_k past the slot table are clamped, and packed queries past T_q are never read."""
    pool_k, _ = _padded((50, 2, 128))
    pool_v, _ = _padded((50, 2, 128))
    q, _ = _padded((3, 8, 128))
    slots = torch.randperm(50, device=DEV)[:20]
    cu_q = _int([0, 1, 2, 3])
    bad_slots = slots.clone()
    bad_slots[[2, 11]] = torch.tensor([-1, 50], device=DEV)
    common = dict(causal=True, softmax_scale=None, window_left=-1, window_right=0, softcap=0.0)
    out, lse = decode.slot_varlen_forward(q, pool_k, pool_v, bad_slots, cu_q, _int([0, 6, 15, 27]), 1, **common)
    fixed = slots.clone()
    fixed[[2, 11]] = 0
    expect, expect_lse = decode.slot_varlen_forward(q, pool_k, pool_v, fixed, cu_q, _int([0, 6, 15, 20]), 1, **common)
    assert torch.equal(out, expect) and torch.equal(lse, expect_lse)
    out, _ = decode.slot_varlen_forward(q, pool_k, pool_v, slots, _int([0, 1, 2, 9]), _int([-5, 6, 15, 20]), 4,
                                        **common)  # fmt: skip
    torch.cuda.synchronize()
    assert not torch.isnan(out).any()


def test_kv_append_skips_slots_outside_the_pool():
    pool_k, buf_k = _padded((40, 2, 128))
    pool_v, buf_v = _padded((40, 2, 128))
    before_k, before_v = buf_k.clone(), buf_v.clone()
    new_k = torch.randn(4, 2, 128, device=DEV, dtype=BF16)
    new_v = torch.randn(4, 2, 128, device=DEV, dtype=BF16)
    decode.kv_append(new_k, new_v, pool_k, pool_v, _int([3, 40, -1, 1 << 40], dtype=torch.int64))
    torch.cuda.synchronize()
    assert torch.equal(pool_k[3], new_k[0]) and torch.equal(pool_v[3], new_v[0])
    before_k[PAD + 3], before_v[PAD + 3] = new_k[0], new_v[0]
    for buf, before in ((buf_k, before_k), (buf_v, before_v)):  # the written row, and nothing outside the pool
        assert torch.equal(buf.isnan(), before.isnan()) and torch.equal(buf.nan_to_num(), before.nan_to_num())


def test_graph_capture_skips_the_host_check():
    """Checks on by default never sync inside a CUDA graph capture (that would fail the capture)."""
    q, k_pages, v_pages, table, lens = _paged_inputs()
    eager = hfp.flash_attn_paged_decode(q, k_pages, v_pages, table, lens)  # compile and load outside
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = hfp.flash_attn_paged_decode(q, k_pages, v_pages, table, lens)
    torch.cuda.current_stream().wait_stream(side)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


# ------------------------------------------------------------------------------------ NaN and scalars


def _nan_case(where, batch, seqlen_q, seqlen_k, heads=8, kv_heads=2, head_dim=128):
    q = torch.randn(batch, seqlen_q, heads, head_dim, device=DEV, dtype=BF16)
    k = torch.randn(batch, seqlen_k, kv_heads, head_dim, device=DEV, dtype=BF16)
    v = torch.randn(batch, seqlen_k, kv_heads, head_dim, device=DEV, dtype=BF16)
    hit = torch.zeros(batch, seqlen_q, heads, dtype=torch.bool, device=DEV)
    qn, kn = q.clone(), k.clone()
    if where == "q":
        qn[batch - 1, seqlen_q - 1, 5, 3] = NAN
        hit[batch - 1, seqlen_q - 1, 5] = True
    else:
        key = seqlen_k - seqlen_q // 2 - 1  # causal: the later half of the queries sees it
        kn[batch - 1, key, 0, 7] = NAN
        first = key - (seqlen_k - seqlen_q)
        hit[batch - 1, max(first, 0):, : heads // kv_heads] = True
    return (q, k, v), (qn, kn, v), hit


@pytest.mark.parametrize("shape", [(2, 300, 300), (1, 1, 16384), (3, 4, 777)], ids=["forward", "split_kv", "decode"])
@pytest.mark.parametrize("where", ["q", "k"])
@pytest.mark.parametrize("softcap", [None, 30.0])
def test_nan_reaches_its_rows_and_no_others(shape, where, softcap):
    clean, dirty, hit = _nan_case(where, *shape)
    out, lse = hfp.flash_attn_func(*clean, causal=True, softcap=softcap, return_lse=True)
    out_n, lse_n = hfp.flash_attn_func(*dirty, causal=True, softcap=softcap, return_lse=True)
    assert torch.equal(torch.isnan(out_n).all(dim=-1), hit)
    assert torch.equal(torch.isnan(lse_n), hit.transpose(1, 2))
    assert torch.equal(out_n[~hit], out[~hit])
    assert torch.equal(lse_n[~hit.transpose(1, 2)], lse[~hit.transpose(1, 2)])


def test_scale_zero_and_softcap_inf_on_the_kernels():
    q = torch.randn(2, 200, 8, 64, device=DEV, dtype=BF16, requires_grad=True)
    k = torch.randn(2, 200, 2, 64, device=DEV, dtype=BF16, requires_grad=True)
    v = torch.randn(2, 200, 2, 64, device=DEV, dtype=BF16, requires_grad=True)
    out = hfp.flash_attn_func(q, k, v, causal=True, softmax_scale=0.0)
    ref, _ = attention_reference(q.float(), k.float(), v.float(), causal=True, softmax_scale=0.0)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)  # a running mean of v, not softmax(qk/8)
    grad = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
    rq, rk, rv = torch.autograd.grad(ref, (q, k, v), grad.float())
    assert (dq == 0).all() and (dk == 0).all()  # scale 0: the scores do not depend on q or k
    torch.testing.assert_close(dv.float(), rv.float(), atol=5e-2, rtol=5e-2)
    with torch.no_grad():
        for seqlen_q in (200, 1):  # forward kernel, decode kernel
            capped = hfp.flash_attn_func(q[:, -seqlen_q:], k, v, causal=True, softcap=math.inf, return_lse=True)
            plain = hfp.flash_attn_func(q[:, -seqlen_q:], k, v, causal=True, return_lse=True)
            assert torch.equal(capped[0], plain[0]) and torch.equal(capped[1], plain[1])


@pytest.mark.parametrize("head_dim", [64, 128])
def test_rows_past_the_last_sequence_are_zero_with_checked_tables(head_dim):
    """The kernels write no q row past ``cu_seqlens_q[-1]``; a call whose tables were checked (the default) gives
    0 there and lse ``-inf`` (the forward, its backward's inputs, and the slot function), and the sequences' rows
    are the same bits as a call without the padding rows."""
    seqlens = [113, 239, 1]
    cu = torch.tensor([0] + seqlens, device=DEV).cumsum(0).int()
    total = sum(seqlens)
    q = torch.randn(total + 7, 4, head_dim, device=DEV, dtype=BF16, requires_grad=True)  # 7 rows of no sequence
    k = torch.randn(total, 2, head_dim, device=DEV, dtype=BF16)
    v = torch.randn(total, 2, head_dim, device=DEV, dtype=BF16)
    out, lse = hfp.flash_attn_varlen_func(q, k, v, cu, cu, 239, 239, causal=True, return_lse=True)
    assert torch.equal(out[total:], torch.zeros_like(out[total:])) and torch.isneginf(lse[:, total:]).all()
    alone, alone_lse = hfp.flash_attn_varlen_func(q[:total].detach(), k, v, cu, cu, 239, 239, causal=True,
                                                  return_lse=True)  # fmt: skip
    assert torch.equal(out[:total], alone) and torch.equal(lse[:, :total], alone_lse)
    out.float().square().sum().backward()
    assert torch.isfinite(q.grad).all() and not q.grad[total:].any()
    with torch.no_grad():
        slot_out = hfp.flash_attn_slot_varlen_func(q.detach(), k, v, torch.arange(total, device=DEV), cu, cu, 239,
                                                   239, causal=True)  # fmt: skip
    assert torch.equal(slot_out[total:], torch.zeros_like(slot_out[total:]))
    torch.testing.assert_close(slot_out[:total], alone, atol=2e-2, rtol=0)
