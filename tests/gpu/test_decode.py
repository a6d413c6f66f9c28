"""Decode kernels on a real GPU: contiguous vs the fp32 oracle, paged/slot == un-paged contiguous,
kv_append, declines, CUDA-graph capture, torch.compile. Layout (batch, seqlen, heads, head_dim).

The cubins the tests use are compiled in parallel before the first test."""

import concurrent.futures
import math

import pytest
import torch

from hf_flashpatch.errors import KernelUnsupported
from hf_flashpatch.reference import attention_reference

pytestmark = pytest.mark.gpu
decode = pytest.importorskip("hf_flashpatch.kernels.decode")
DEV = "cuda"


@pytest.fixture
def variant():
    """The one shipped decode kernel (the tests once ran per kernel variant; their parameter stays)."""
    return "shipped"


@pytest.fixture(scope="module", autouse=True)
def _compile_variants_in_parallel():
    """Compile the (head dim x dtype x addressing) cubins the tests below use, 16 at a time."""
    if not torch.cuda.is_available():
        return
    from hf_flashpatch.kernels.build import compile_cubin, device_arch

    arch = device_arch(torch.device(DEV))
    shapes = {(d, True, "contiguous", False) for d in (32, 64, 80, 96, 128, 256)}
    shapes |= {(64, True, "contiguous", True), (128, False, "contiguous", False)}
    shapes |= {(128, True, "block_table", False), (128, True, "slot", False)}
    shapes |= {(d, True, "block_table", False) for d in (32, 64, 80, 96, 256)}
    builds = {decode.DecodeConfig(*shape).build(arch) for shape in shapes}
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(compile_cubin, builds))


def _poison_allocator():
    """Fill recently freed caching-allocator memory with NaN, so outputs/workspaces the kernels
    allocate start as NaN and any element they fail to write shows up."""
    torch.cuda.synchronize()
    torch.empty(64 << 20, device=DEV, dtype=torch.float32).fill_(float("nan"))  # 256 MB, freed at once


def _lowp_attention(q, k, v, seqlens, window_left, window_right, softcap, scale):
    """Same-precision torch run (matmuls and softmax in q's dtype) for the error bound."""
    outs = []
    group = q.shape[2] // k.shape[2]
    for b in range(q.shape[0]):
        length = int(seqlens[b])
        qb = q[b].transpose(0, 1)  # (H, S_q, D)
        kb = k[b, :length].transpose(0, 1).repeat_interleave(group, 0)  # (H, L, D)
        vb = v[b, :length].transpose(0, 1).repeat_interleave(group, 0)
        s = torch.matmul(qb, kb.transpose(-1, -2)) * scale  # (H, S_q, L) low precision
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        pos = torch.arange(q.shape[1], device=DEV)[:, None] + length - q.shape[1]
        key = torch.arange(length, device=DEV)[None]
        visible = torch.ones_like(pos - key, dtype=torch.bool)
        if window_left >= 0:
            visible &= key >= pos - window_left
        if window_right >= 0:
            visible &= key <= pos + window_right
        s = s.masked_fill(~visible, float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        outs.append(torch.matmul(p, vb).transpose(0, 1))  # (S_q, H, D)
    return torch.stack(outs)


def _oracle(q, k, v, seqlens, window_left, window_right, softcap, scale):
    """fp32 oracle per sequence (its valid keys only): out (B, S_q, H, D) fp32, lse (B, H, S_q)."""
    window = (window_left if window_left >= 0 else None, window_right if window_right >= 0 else None)
    outs, lses = [], []
    for b in range(q.shape[0]):
        length = int(seqlens[b])
        o, l = attention_reference(
            q[b : b + 1].float(), k[b : b + 1, :length].float(), v[b : b + 1, :length].float(),
            softmax_scale=scale, window=window, softcap=softcap or None,
        )  # fmt: skip
        outs.append(o)
        lses.append(l)
    return torch.cat(outs), torch.cat(lses)


def _check_against_oracle(out, lse, q, k, v, seqlens, wl, wr, softcap, scale):
    ref, ref_lse = _oracle(q, k, v, seqlens, wl, wr, softcap, scale)
    lowp = _lowp_attention(q, k, v, seqlens, wl, wr, softcap, scale).float()
    assert not torch.isnan(out).any(), "unwritten (NaN sentinel) or NaN output elements"
    err = (out.float() - ref).abs().max().item()
    base = (lowp - ref).abs().max().item()
    assert err <= 2 * base + 1e-3, f"kernel error {err:.2e} vs same-precision torch {base:.2e}"
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite), "lse -inf pattern differs from the oracle"
    torch.testing.assert_close(lse[finite], ref_lse[finite], atol=2e-2, rtol=1e-3)


CONTIGUOUS_CASES = [
    # batch, cache len, S_q, heads, kv heads, head dim, window_left, softcap, variable seqlens
    (1, 1, 1, 8, 8, 128, -1, 0.0, False),
    (12, 97, 1, 32, 8, 128, -1, 0.0, True),
    (3, 2048, 1, 32, 4, 64, -1, 0.0, False),
    (2, 54, 1, 16, 1, 128, -1, 0.0, False),  # MQA: 16 rows per KV head
    (4, 1023, 4, 16, 4, 128, -1, 0.0, True),  # speculative decoding: 4 tokens x group 4
    (2, 16384, 1, 32, 8, 128, -1, 0.0, False),  # split-KV
    (5, 239, 3, 8, 2, 64, 100, 30.0, True),  # window + softcap
    (3, 113, 1, 4, 4, 32, -1, 0.0, True),
    (3, 113, 2, 6, 2, 96, -1, 0.0, True),
    (2, 300, 1, 4, 1, 256, 63, 0.0, False),
    (3, 239, 2, 32, 32, 80, -1, 0.0, True),  # Phi-2's heads: head dim 80 (five k-steps, unswizzled rows)
    (2, 8192, 1, 32, 32, 80, -1, 0.0, False),  # split-KV at 80
]


@pytest.mark.parametrize("batch, length, seqlen_q, heads, kv_heads, head_dim, wl, softcap, varlen", CONTIGUOUS_CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_contiguous_decode_matches_oracle(
    batch, length, seqlen_q, heads, kv_heads, head_dim, wl, softcap, varlen, dtype, variant
):
    q = torch.randn(batch, seqlen_q, heads, head_dim, device=DEV, dtype=dtype)
    # a transformers-style (B, H_kv, S, D) cache read as (B, S, H_kv, D): strided, never copied
    k = torch.randn(batch, kv_heads, length, head_dim, device=DEV, dtype=dtype).transpose(1, 2)
    v = torch.randn(batch, kv_heads, length, head_dim, device=DEV, dtype=dtype).transpose(1, 2)
    seqlens = torch.randint(1, length + 1, (batch,), device=DEV, dtype=torch.int32) if varlen else None
    scale = 1.0 / math.sqrt(head_dim)
    _poison_allocator()
    out, lse = decode.decode_forward(
        q, k, v, seqlens, causal=True, softmax_scale=scale, window_left=wl, window_right=0, softcap=softcap
    )
    lengths = seqlens if varlen else torch.full((batch,), length)
    _check_against_oracle(out, lse, q, k, v, lengths, wl, 0, softcap, scale)


def test_fp16_and_noncausal(variant):
    q = torch.randn(3, 2, 8, 128, device=DEV, dtype=torch.float16)
    k = torch.randn(3, 500, 2, 128, device=DEV, dtype=torch.float16)
    v = torch.randn(3, 500, 2, 128, device=DEV, dtype=torch.float16)
    out, lse = decode.decode_forward(q, k, v, None, causal=False, softmax_scale=0.1, window_left=-1, window_right=-1,
                                     softcap=0.0)  # fmt: skip
    _check_against_oracle(out, lse, q, k, v, torch.full((3,), 500), -1, -1, 0.0, 0.1)


def _page(k, v, seqlens, page_size, generator):
    """Scatter contiguous (B, S, H_kv, D) caches into a shuffled page pool; returns pools + table."""
    batch, max_len = k.shape[:2]
    pages_per_seq = -(-max_len // page_size)
    num_pages = batch * pages_per_seq + 3
    order = torch.randperm(num_pages, generator=generator)[: batch * pages_per_seq].view(batch, pages_per_seq)
    shape = (num_pages, page_size, *k.shape[2:])
    k_pages = torch.randn(shape, device=DEV, dtype=k.dtype)  # garbage in unused slots, never read
    v_pages = torch.randn(shape, device=DEV, dtype=k.dtype)
    pad = pages_per_seq * page_size - max_len
    k_padded = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, pad)).view(batch, pages_per_seq, page_size, *k.shape[2:])
    v_padded = torch.nn.functional.pad(v, (0, 0, 0, 0, 0, pad)).view(batch, pages_per_seq, page_size, *k.shape[2:])
    table = order.to(DEV)
    k_pages[table] = k_padded
    v_pages[table] = v_padded
    return k_pages, v_pages, table.to(torch.int32)


PAGED_CASES = [
    # page size, batch, max len, heads, kv heads
    (16, 12, 2048, 32, 8),
    (1, 12, 300, 32, 4),
    (256, 128, 2048, 32, 8),
    (16, 1, 16384, 8, 8),
    (256, 1, 16384, 32, 4),
    (3, 5, 97, 8, 1),
]


@pytest.mark.parametrize("page_size, batch, max_len, heads, kv_heads", PAGED_CASES)
def test_paged_and_slot_equal_unpaged(page_size, batch, max_len, heads, kv_heads, variant):
    gen = torch.Generator().manual_seed(page_size * 1000 + batch)
    q = torch.randn(batch, 1, heads, 128, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(batch, max_len, kv_heads, 128, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(batch, max_len, kv_heads, 128, device=DEV, dtype=torch.bfloat16)
    seqlens = torch.randint(1, max_len + 1, (batch,), generator=gen).to(DEV, torch.int32)
    seqlens[0] = max_len
    if batch > 3:
        seqlens[1:4] = torch.tensor([1, 54, 97], device=DEV, dtype=torch.int32).clamp(max=max_len)
    k_pages, v_pages, table = _page(k, v, seqlens, page_size, gen)
    common = dict(causal=True, softmax_scale=0.088, window_left=-1, window_right=0, softcap=0.0)
    ref_out, ref_lse = decode.decode_forward(q, k, v, seqlens, **common)
    _poison_allocator()
    out, lse = decode.paged_decode_forward(q, k_pages, v_pages, table, seqlens, **common)
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out, ref_out, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, ref_lse, atol=1e-3, rtol=1e-4)
    # Slot form: the same pool flattened to (num_pages * page_size, H_kv, D).
    flat_k, flat_v = k_pages.flatten(0, 1), v_pages.flatten(0, 1)
    slot_lists = [
        (table[b, : -(-int(n) // page_size)].long()[:, None] * page_size + torch.arange(page_size, device=DEV)).flatten()[: int(n)]
        for b, n in enumerate(seqlens.tolist())
    ]  # fmt: skip
    slots = torch.cat(slot_lists)
    cu = torch.nn.functional.pad(seqlens.cumsum(0), (1, 0)).to(torch.int32)
    _poison_allocator()
    slot_out, slot_lse = decode.slot_decode_forward(q, flat_k, flat_v, slots, cu, **common)
    torch.testing.assert_close(slot_out, ref_out, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(slot_lse, ref_lse, atol=1e-3, rtol=1e-4)
    if batch <= 12:  # the un-paged path itself against the oracle
        _check_against_oracle(ref_out, ref_lse, q, k, v, seqlens, -1, 0, 0.0, 0.088)


@pytest.mark.parametrize("head_dim", [32, 64, 80, 96, 256])
@pytest.mark.parametrize("page_size", [16, 48])
def test_paged_other_head_dims_equal_unpaged(head_dim, page_size, variant):
    """The paged copy forms at every supported head dim (the grid above runs D = 128): paged == the
    un-paged contiguous path, which itself matches the fp32 oracle."""
    gen = torch.Generator().manual_seed(head_dim + page_size)
    batch, max_len, heads, kv_heads = 4, 700, 8, 2
    q = torch.randn(batch, 1, heads, head_dim, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(batch, max_len, kv_heads, head_dim, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(batch, max_len, kv_heads, head_dim, device=DEV, dtype=torch.bfloat16)
    seqlens = torch.tensor([700, 1, 239, 513], device=DEV, dtype=torch.int32)
    k_pages, v_pages, table = _page(k, v, seqlens, page_size, gen)
    common = dict(causal=True, softmax_scale=None, window_left=-1, window_right=0, softcap=0.0)
    ref_out, ref_lse = decode.decode_forward(q, k, v, seqlens, **common)
    _check_against_oracle(ref_out, ref_lse, q, k, v, seqlens, -1, 0, 0.0, 1.0 / math.sqrt(head_dim))
    _poison_allocator()
    out, lse = decode.paged_decode_forward(q, k_pages, v_pages, table, seqlens, **common)
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out, ref_out, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, ref_lse, atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("page_size, window_left", [(16, 100), (32, 37), (16, 64)])
def test_paged_window_equals_unpaged(page_size, window_left, variant):
    """Sliding windows start a CTA's keys mid-tile unless the window is a multiple of 16 (100 and 37:
    the per-key addressing form inside the page-tile builds; 64: whole tiles), across page boundaries."""
    gen = torch.Generator().manual_seed(page_size + window_left)
    batch, max_len, heads, kv_heads = 6, 1500, 16, 4
    q = torch.randn(batch, 2, heads, 128, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(batch, max_len, kv_heads, 128, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(batch, max_len, kv_heads, 128, device=DEV, dtype=torch.bfloat16)
    seqlens = torch.tensor([1500, 1, 117, 640, 999, 33], device=DEV, dtype=torch.int32)
    k_pages, v_pages, table = _page(k, v, seqlens, page_size, gen)
    common = dict(causal=True, softmax_scale=0.088, window_left=window_left, window_right=0, softcap=0.0)
    ref_out, ref_lse = decode.decode_forward(q, k, v, seqlens, **common)
    _check_against_oracle(ref_out, ref_lse, q, k, v, seqlens, window_left, 0, 0.0, 0.088)
    _poison_allocator()
    out, lse = decode.paged_decode_forward(q, k_pages, v_pages, table, seqlens, **common)
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out, ref_out, atol=2e-2, rtol=2e-2)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    torch.testing.assert_close(lse[finite], ref_lse[finite], atol=1e-3, rtol=1e-4)


def test_slot_varlen_packed_queries(variant):
    """Packed continuous-batching form: sequences with 1, 3, 0 and 7 queries, padded rows after them."""
    heads, kv_heads, d = 16, 4, 128
    lens_q, lens_k = [1, 3, 0, 7], [50, 203, 9, 1500]
    pool = torch.randn(4000, kv_heads, d, device=DEV, dtype=torch.bfloat16)
    vpool = torch.randn(4000, kv_heads, d, device=DEV, dtype=torch.bfloat16)
    perm = torch.randperm(4000, device=DEV)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], device=DEV, dtype=torch.int32)
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], device=DEV, dtype=torch.int32)
    slots = perm[: sum(lens_k)]
    total_q = sum(lens_q) + 5  # padding tokens belong to no sequence
    q = torch.randn(total_q, heads, d, device=DEV, dtype=torch.bfloat16)
    out, lse = decode.slot_varlen_forward(q, pool, vpool, slots, cu_q, cu_k, 64, causal=True, softmax_scale=None,
                                          window_left=-1, window_right=0, softcap=0.0)  # fmt: skip
    for b in range(4):
        q0, q1, k0, k1 = cu_q[b].item(), cu_q[b + 1].item(), cu_k[b].item(), cu_k[b + 1].item()
        if q1 == q0:
            continue
        idx = slots[k0:k1]
        ref, ref_lse = attention_reference(q[None, q0:q1], pool[idx][None], vpool[idx][None], causal=True)
        torch.testing.assert_close(out[q0:q1], ref[0], atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(lse[:, q0:q1], ref_lse[0], atol=1e-3, rtol=1e-3)
    assert torch.all(out[sum(lens_q) :] == 0) and torch.all(torch.isinf(lse[:, sum(lens_q) :]))


def test_kv_append_matches_index_copy():
    pool_k = torch.randn(300, 4, 128, device=DEV, dtype=torch.bfloat16)
    pool_v = torch.randn(300, 4, 128, device=DEV, dtype=torch.bfloat16)
    new = torch.randn(4, 37, 128, device=DEV, dtype=torch.bfloat16).transpose(0, 1)  # (37, 4, 128) strided
    new_v = torch.randn(37, 4, 128, device=DEV, dtype=torch.bfloat16)
    slots = torch.randperm(300, device=DEV)[:37]
    slots[5] = -1  # padding: skipped
    expect_k, expect_v = pool_k.clone(), pool_v.clone()
    keep = slots >= 0
    expect_k.index_copy_(0, slots[keep], new[keep])
    expect_v.index_copy_(0, slots[keep], new_v[keep])
    decode.kv_append(new, new_v, pool_k, pool_v, slots)
    assert torch.equal(pool_k, expect_k) and torch.equal(pool_v, expect_v)


def test_paged_kv_cache_on_gpu_matches_contiguous():
    from hf_flashpatch.paged import PagedKVCache

    cache = PagedKVCache(num_pages=64, page_size=16, kv_heads=2, head_dim=128, dtype=torch.bfloat16, device=DEV,
                         num_layers=2)  # fmt: skip
    ids = ["a", "b", "c"]
    lengths = [5, 70, 33]
    full_k = [torch.randn(n, 2, 128, device=DEV, dtype=torch.bfloat16) for n in lengths]
    full_v = [torch.randn(n, 2, 128, device=DEV, dtype=torch.bfloat16) for n in lengths]
    for step in range(max(lengths)):  # token by token, interleaved: pages of the three sequences alternate
        active = [i for i, n in enumerate(lengths) if step < n]
        cache.allocate([ids[i] for i in active], 1)
        k_new = torch.stack([full_k[i][step : step + 1] for i in active])  # (B, 1, H_kv, D)
        v_new = torch.stack([full_v[i][step : step + 1] for i in active])
        cache.append([ids[i] for i in active], k_new, v_new, layer=1)
    q = torch.randn(3, 1, 8, 128, device=DEV, dtype=torch.bfloat16)
    out = cache.decode(q, ids, layer=1)
    for b, n in enumerate(lengths):
        ref, _ = attention_reference(q[b : b + 1], full_k[b][None], full_v[b][None], causal=True)
        torch.testing.assert_close(out[b : b + 1], ref, atol=2e-2, rtol=2e-2)


def test_declines_what_it_does_not_serve():
    q = torch.randn(2, 1, 8, 128, device=DEV)
    k = torch.randn(2, 64, 2, 128, device=DEV)
    common = dict(causal=True, softmax_scale=None, window_left=-1, window_right=0, softcap=0.0)
    with pytest.raises(KernelUnsupported, match="fp16/bf16, got torch.float32"):
        decode.decode_forward(q, k, k, None, **common)
    qb, kb = q.bfloat16(), k.bfloat16()
    with pytest.raises(KernelUnsupported, match="S_q=17, group=4"):
        decode.decode_forward(torch.randn(2, 17, 8, 128, device=DEV, dtype=torch.bfloat16), kb, kb, None, **common)
    with pytest.raises(KernelUnsupported, match=r"head dims \(32, 64, 80, 96, 128, 256\).*got q \(2, 1, 8, 72\)"):
        decode.decode_forward(qb[..., :72], kb[..., :72], kb[..., :72], None, **common)


def test_cuda_graph_capture_and_side_stream():
    batch, length = 4, 777
    q = torch.randn(batch, 1, 32, 128, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(batch, length, 8, 128, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(batch, length, 8, 128, device=DEV, dtype=torch.bfloat16)
    seqlens = torch.tensor([777, 1, 500, 64], device=DEV, dtype=torch.int32)
    common = dict(causal=True, softmax_scale=None, window_left=-1, window_right=0, softcap=0.0)
    decode.decode_forward(q, k, v, seqlens, **common)  # compile + load outside the capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out_static, _ = decode.decode_forward(q, k, v, seqlens, **common)
    torch.cuda.current_stream().wait_stream(side)
    for _ in range(2):  # new inputs in the captured buffers, replay, compare with eager
        q.normal_()
        k.normal_()
        seqlens[1] = int(torch.randint(1, length, ()))
        graph.replay()
        eager, _ = decode.decode_forward(q, k, v, seqlens, **common)
        torch.testing.assert_close(out_static, eager, atol=0, rtol=0)
    with torch.cuda.stream(side):
        on_side, _ = decode.decode_forward(q, k, v, seqlens, **common)
    torch.cuda.current_stream().wait_stream(side)
    torch.testing.assert_close(on_side, eager, atol=0, rtol=0)


def test_torch_compile_sees_the_custom_op():
    q = torch.randn(2, 1, 8, 64, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(2, 200, 2, 64, device=DEV, dtype=torch.bfloat16)

    def step(q, k):
        out, lse = decode.decode_forward(q, k, k, None, causal=True, softmax_scale=None, window_left=-1,
                                         window_right=0, softcap=0.0)  # fmt: skip
        return out * 2, lse

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(q, k), step(q, k))
