"""PagedKVCache bookkeeping and the paged references, on CPU. Layout (batch, seqlen, heads, head_dim)."""

import pytest
import torch

from hf_flashpatch import PagePoolExhausted
from hf_flashpatch.paged import PagedKVCache, check_page_table
from hf_flashpatch.reference import attention_reference, paged_decode_reference, slot_decode_reference


def _fill(cache, seq_ids, lengths, layer=0, chunk=7):
    """Grow every sequence to its length a few tokens at a time (interleaved, so pages of different
    sequences alternate in the pool) and return the contiguous K/V each sequence should hold."""
    contiguous = {s: (torch.randn(n, cache.kv_heads, cache.head_dim), torch.randn(n, cache.kv_heads, cache.head_dim))
                  for s, n in zip(seq_ids, lengths)}  # fmt: skip
    written = dict.fromkeys(seq_ids, 0)
    while any(written[s] < n for s, n in zip(seq_ids, lengths)):
        for s, n in zip(seq_ids, lengths):
            step = min(chunk, n - written[s])
            if step == 0:
                continue
            cache.allocate(s, step)
            k, v = contiguous[s]
            cache.append([s], k[None, written[s] : written[s] + step], v[None, written[s] : written[s] + step], layer)
            written[s] += step
    return contiguous


def test_bookkeeping_pages_lengths_free():
    cache = PagedKVCache(num_pages=10, page_size=4, kv_heads=2, head_dim=8, dtype=torch.float32)
    cache.allocate("a", 5)  # 2 pages
    cache.allocate(["b", "c"], 1)  # 1 page each
    assert cache.seq_len("a") == 5 and cache.pages_of("a") == [0, 1]
    assert cache.pages_of("b") == [2] and cache.pages_of("c") == [3]
    assert cache.num_free_pages == 6
    cache.allocate("a", 3)  # 8 tokens still fit in 2 pages
    assert cache.pages_of("a") == [0, 1] and cache.num_free_pages == 6
    cache.allocate("a", 1)  # the 9th token needs a third page
    assert cache.pages_of("a") == [0, 1, 4]
    table = cache.page_table(["a", "b"])
    assert table.dtype == torch.int32 and table.tolist() == [[0, 1, 4], [2, 0, 0]]
    assert cache.seqlens(["a", "b", "c"]).tolist() == [9, 1, 1]
    cache.free("a")
    assert cache.num_free_pages == 8
    cache.allocate("d", 12)  # reuses freed pages
    assert sorted(cache.pages_of("d")) == [0, 1, 4]
    assert cache.slots("d", 0, 2) == [cache.pages_of("d")[0] * 4, cache.pages_of("d")[0] * 4 + 1]
    with pytest.raises(KeyError, match="unknown sequence 'a'"):
        cache.seq_len("a")


def test_exhaustion_raises_and_changes_nothing():
    cache = PagedKVCache(num_pages=4, page_size=2, kv_heads=1, head_dim=8, dtype=torch.float32)
    data = _fill(cache, ["x", "y"], [3, 3])  # 2 pages each: the pool is full
    k_before, v_before = cache.k_pages.clone(), cache.v_pages.clone()
    with pytest.raises(PagePoolExhausted, match=r"2 pages needed .* 0 free of 4"):
        cache.allocate(["x", "y"], 2)
    with pytest.raises(PagePoolExhausted, match=r"1 pages needed"):
        cache.allocate("z", 1)
    assert cache.seq_len("x") == 3 and cache.seq_len("y") == 3 and cache.num_free_pages == 0
    assert "z" not in cache._lengths
    assert torch.equal(cache.k_pages, k_before) and torch.equal(cache.v_pages, v_before)
    k, v = cache.gather("x")
    assert torch.equal(k, data["x"][0]) and torch.equal(v, data["x"][1])
    cache.allocate("x", 1)  # the partly used last page still has room: no new page needed
    assert cache.seq_len("x") == 4


def test_bad_page_index_and_bad_shapes_are_clear():
    with pytest.raises(ValueError, match=r"page_table\[1, 1\] = 9 is not a page of this pool \(valid: 0..7\)"):
        check_page_table(torch.tensor([[0, 1], [2, 9]]), 8, torch.tensor([5, 6]), page_size=4)
    with pytest.raises(ValueError, match="page_table has only 2 columns"):
        check_page_table(torch.tensor([[0, 1]]), 8, torch.tensor([9]), page_size=4)
    check_page_table(torch.tensor([[0, -1]]), 8, torch.tensor([3]), page_size=4)  # padding past the length is fine
    cache = PagedKVCache(num_pages=4, page_size=2, kv_heads=1, head_dim=8, dtype=torch.float32)
    cache.allocate("a", 1)
    with pytest.raises(ValueError, match=r"got \(1, 1, 2, 8\)"):
        cache.append(["a"], torch.zeros(1, 1, 2, 8), torch.zeros(1, 1, 2, 8))
    with pytest.raises(ValueError, match="layer must be in 0..0, got 3"):
        cache.append(["a"], torch.zeros(1, 1, 1, 8), torch.zeros(1, 1, 1, 8), layer=3)
    with pytest.raises(ValueError, match="num_pages must be a positive int, got 0"):
        PagedKVCache(num_pages=0, page_size=2, kv_heads=1, head_dim=8)


@pytest.mark.parametrize("page_size", [1, 3, 16])
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2), (4, 1)])
def test_paged_decode_matches_contiguous_reference(page_size, heads, kv_heads):
    lengths = [1, 13, 40]
    cache = PagedKVCache(num_pages=64, page_size=page_size, kv_heads=kv_heads, head_dim=16, dtype=torch.float32,
                         num_layers=2)  # fmt: skip
    seq_ids = [10, 11, 12]
    data = _fill(cache, seq_ids, lengths, layer=1, chunk=5)
    q = torch.randn(3, 2, heads, 16)  # two query tokens per sequence (speculative-decoding shape)
    kwargs = dict(causal=True, softmax_scale=0.3, window=(9, 0), softcap=5.0)
    paged_out, paged_lse = paged_decode_reference(
        q, cache.k_pages[1], cache.v_pages[1], cache.page_table(seq_ids), cache.seqlens(seq_ids), **kwargs
    )
    api_out = cache.decode(q, seq_ids, layer=1, **kwargs)  # CPU: the torch fallback through the API
    for b, s in enumerate(seq_ids):
        k, v = data[s]
        ref_out, ref_lse = attention_reference(q[b : b + 1], k[None], v[None], **kwargs)
        torch.testing.assert_close(paged_out[b : b + 1], ref_out, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(paged_lse[b : b + 1], ref_lse, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(api_out[b : b + 1], ref_out, rtol=1e-4, atol=1e-4)
    # Sequence 0 has one key and two causal queries: the first query sees nothing (zeros, lse -inf).
    assert torch.all(paged_out[0, 0] == 0) and torch.all(torch.isinf(paged_lse[0, :, 0]))
    # Layer 0 was never written: still zeros.
    assert torch.all(cache.k_pages[0] == 0)


def test_slot_reference_matches_block_table_with_page_size_one():
    cache = PagedKVCache(num_pages=40, page_size=1, kv_heads=2, head_dim=8, dtype=torch.float32)
    seq_ids = ["p", "q"]
    _fill(cache, seq_ids, [11, 17], chunk=3)
    q = torch.randn(2, 1, 4, 8)
    slots = torch.tensor(cache.slots("p", 0, 11) + cache.slots("q", 0, 17))
    cu = torch.tensor([0, 11, 28])
    pool_k, pool_v = cache.k_pages[0, :, 0], cache.v_pages[0, :, 0]  # (num_slots, H_kv, D)
    slot_out, slot_lse = slot_decode_reference(q, pool_k, pool_v, slots, cu, causal=True)
    block_out, block_lse = paged_decode_reference(
        q, cache.k_pages[0], cache.v_pages[0], cache.page_table(seq_ids), cache.seqlens(seq_ids), causal=True
    )
    torch.testing.assert_close(slot_out, block_out)
    torch.testing.assert_close(slot_lse, block_lse)


def _emulated_slot_varlen(q, k_pool, v_pool, slots, cu_q, cu_k, max_q, *, causal, softmax_scale, **_):
    """The packed slot decode contract, computed with the reference (stands in for the CUDA kernel)."""
    out = torch.zeros_like(q)  # (T_q, H, D)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"))  # (H, T_q)
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b in range(len(ck) - 1):
        q0, q1 = cq[b], min(cq[b + 1], cq[b] + int(max_q))
        if q1 > q0:
            idx = slots[ck[b] : ck[b + 1]]
            o, l = attention_reference(q[None, q0:q1], k_pool[idx][None], v_pool[idx][None], causal=causal,
                                       softmax_scale=softmax_scale)  # fmt: skip
            out[q0:q1], lse[:, q0:q1] = o[0], l[0]
    return out, lse


def test_paged_kernel_path_logic_with_emulated_kernels(monkeypatch):
    """``backend.paged_kernel`` (write through write_index, read through read_index, packed queries,
    chunked prefill) under real continuous batching, with the two CUDA kernels replaced by torch
    stand-ins so it runs on CPU. Needs a transformers with ``paged|`` functions (< 5.19)."""
    transformers = pytest.importorskip("transformers")
    from hf_flashpatch.backend.patch import _paged_prefix_supported

    if not hasattr(transformers, "AttentionInterface") or not _paged_prefix_supported():
        pytest.skip(f"transformers {transformers.__version__} has no paged| attention functions")
    from transformers import AttentionInterface, GenerationConfig, LlamaConfig, LlamaForCausalLM
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    import hf_flashpatch.api
    from hf_flashpatch.backend import paged, paged_kernel
    from hf_flashpatch.kernels import decode

    calls = {"append": 0, "slot": 0}

    def append(k_new, v_new, k_pool, v_pool, slots):
        calls["append"] += 1
        k_pool.index_copy_(0, slots, k_new)
        v_pool.index_copy_(0, slots, v_new)

    def slot(*args, **kwargs):
        calls["slot"] += 1
        return _emulated_slot_varlen(*args, **kwargs)

    monkeypatch.setattr(paged_kernel, "kernels_unavailable_reason", lambda q: None)
    monkeypatch.setattr(hf_flashpatch.api, "kernels_unavailable_reason", lambda q: None)  # the API calls the stand-ins
    monkeypatch.setattr(decode, "kv_append", append)
    monkeypatch.setattr(decode, "slot_varlen_forward", slot)
    AttentionInterface.register("paged|emulated", paged.paged_attention_forward)
    config = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, initializer_range=0.2)  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    prompts = [torch.randint(1, 256, (n,)).tolist() for n in (5, 70, 1)]
    gen = GenerationConfig(max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
    batching = ContinuousBatchingConfig(block_size=16, num_blocks=32, max_batch_tokens=48, max_requests_per_batch=4)
    results = {}
    for attn in ("paged|eager", "paged|emulated"):
        model.set_attn_implementation(attn)
        out = model.generate_batch(inputs=prompts, generation_config=gen, continuous_batching_config=batching)
        results[attn] = {key: list(r.generated_tokens) for key, r in out.items()}
    assert calls["append"] > 0 and calls["slot"] > 0
    assert len(results["paged|emulated"]) == 3
    assert results["paged|emulated"] == results["paged|eager"]


# ------------------------------------------------------------------ misuse that used to pass silently (issue 18)


def test_append_must_write_exactly_the_allocated_tokens():
    """append before allocate used to overwrite the last tokens; now it names the sequence and layer."""
    cache = PagedKVCache(num_pages=8, page_size=4, kv_heads=1, head_dim=8, dtype=torch.float32)
    data = _fill(cache, ["a", "b"], [5, 3])
    before = cache.k_pages.clone()
    with pytest.raises(ValueError, match=r"sequence 'a' has 0 token\(s\) allocated and not yet written in layer 0, "
                                         r"but append got S_new = 1"):  # fmt: skip
        cache.append(["a"], torch.ones(1, 1, 1, 8), torch.ones(1, 1, 1, 8))
    assert torch.equal(cache.k_pages, before)
    k, _ = cache.gather("a")
    assert torch.equal(k, data["a"][0])
    cache.allocate(["a", "b"], 2)
    with pytest.raises(ValueError, match=r"'a' has 2 token\(s\) allocated .* got S_new = 1"):
        cache.append(["a", "b"], torch.ones(2, 1, 1, 8), torch.ones(2, 1, 1, 8))  # would leave a gap
    cache.append(["a", "b"], torch.ones(2, 2, 1, 8), torch.ones(2, 2, 1, 8))
    cache.free("b")
    cache.allocate("b", 1)  # a freed id starts over
    cache.append(["b"], torch.ones(1, 1, 1, 8), torch.ones(1, 1, 1, 8))
    layered = PagedKVCache(num_pages=8, page_size=4, kv_heads=1, head_dim=8, dtype=torch.float32, num_layers=2)
    layered.allocate("x", 2)
    for layer in (0, 1):  # one allocate serves every layer
        layered.append(["x"], torch.ones(1, 2, 1, 8), torch.ones(1, 2, 1, 8), layer=layer)
    with pytest.raises(ValueError, match=r"'x' has 0 token\(s\) allocated and not yet written in layer 1"):
        layered.append(["x"], torch.ones(1, 1, 1, 8), torch.ones(1, 1, 1, 8), layer=1)


def test_append_refuses_duplicate_ids():
    cache = PagedKVCache(num_pages=8, page_size=4, kv_heads=1, head_dim=8, dtype=torch.float32)
    cache.allocate("a", 2)
    with pytest.raises(ValueError, match=r"seq_ids must be distinct, got \['a', 'a'\]"):
        cache.append(["a", "a"], torch.zeros(2, 1, 1, 8), torch.zeros(2, 1, 1, 8))


def test_empty_id_list_and_batch_zero():
    cache = PagedKVCache(num_pages=8, page_size=4, kv_heads=2, head_dim=8, dtype=torch.float32)
    cache.allocate([], 1)
    cache.append([], torch.zeros(0, 1, 2, 8), torch.zeros(0, 1, 2, 8))
    out = cache.decode(torch.zeros(0, 1, 4, 8), [])
    assert out.shape == (0, 1, 4, 8)
    out, lse = cache.decode(torch.zeros(0, 1, 4, 8), [], return_lse=True)
    assert out.shape == (0, 1, 4, 8) and lse.shape == (0, 4, 1)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(head_dim=512), ValueError, "head_dim must be in 1..256, got 512"),
        (dict(dtype=torch.int32), TypeError, r"dtype must be torch.float16, torch.bfloat16 or .* got torch.int32"),
        (dict(dtype="bf16"), TypeError, r"dtype must be .* got 'bf16'"),
        (dict(num_pages=True), ValueError, "num_pages must be a positive int, got True"),
    ],
)
def test_constructor_refuses_what_decode_cannot_serve(kwargs, error, match):
    args = dict(num_pages=4, page_size=2, kv_heads=1, head_dim=8) | kwargs
    with pytest.raises(error, match=match):
        PagedKVCache(**args)


def test_decode_skips_the_device_check_of_its_own_tables(monkeypatch):
    import hf_flashpatch.api

    seen = []
    real = hf_flashpatch.api.flash_attn_paged_decode
    spy = lambda *a, **kw: seen.append(kw) or real(*a, **kw)  # noqa: E731
    monkeypatch.setattr(hf_flashpatch.api, "flash_attn_paged_decode", spy)
    cache = PagedKVCache(num_pages=8, page_size=4, kv_heads=1, head_dim=8, dtype=torch.float32)
    _fill(cache, ["a"], [6])
    cache.decode(torch.randn(1, 1, 2, 8), ["a"])
    assert seen[-1]["check_inputs"] is False


def test_check_page_table_rejects_negative_lengths():
    with pytest.raises(ValueError, match=r"seqlens\[0\] = -2 is negative"):
        check_page_table(torch.tensor([[0, 1]]), 8, torch.tensor([-2]), page_size=4)


# ------------------------------------------------------------------ misuse found by the 2026-12-04 review


def test_decode_refuses_tokens_allocated_but_not_appended_in_its_layer():
    """A forgotten append used to make decode read whatever the page held: here a freed sequence's V."""
    cache = PagedKVCache(num_pages=2, page_size=4, kv_heads=1, head_dim=8, dtype=torch.float32, num_layers=2)
    cache.allocate(["old"], 4)
    cache.append(["old"], torch.ones(1, 4, 1, 8), torch.full((1, 4, 1, 8), 7.0), layer=0)
    cache.free("old")
    cache.allocate(["new"], 1)
    cache.append(["new"], torch.zeros(1, 1, 1, 8), torch.zeros(1, 1, 1, 8), layer=1)
    with pytest.raises(ValueError, match=r"'new' has 1 token\(s\) allocated but not yet appended in layer 0"):
        cache.decode(torch.randn(1, 1, 1, 8), ["new"], layer=0)
    out = cache.decode(torch.randn(1, 1, 1, 8), ["new"], layer=1)  # the layer that was written
    assert torch.equal(out, torch.zeros(1, 1, 1, 8))


@pytest.mark.parametrize("ids", [range(2), {"a", "b"}, torch.tensor([0, 1]), (i for i in "ab")])
def test_seq_ids_other_than_one_id_or_a_list_are_refused(ids):
    """allocate used to take a range or a tensor as one id, append and decode as several."""
    cache = PagedKVCache(num_pages=8, page_size=4, kv_heads=1, head_dim=8, dtype=torch.float32)
    with pytest.raises(TypeError, match="seq_ids must be one id .* or a list of ids, got"):
        cache.allocate(ids, 1)
    assert cache.num_free_pages == 8


def test_a_string_id_is_one_id_in_every_method():
    cache = PagedKVCache(num_pages=8, page_size=4, kv_heads=1, head_dim=8, dtype=torch.float32)
    cache.allocate("ab", 1)
    cache.append("ab", torch.ones(1, 1, 1, 8), torch.ones(1, 1, 1, 8))
    assert cache.decode(torch.randn(1, 1, 1, 8), "ab").shape == (1, 1, 1, 8)
    with pytest.raises(ValueError, match=r"q must be \(B=1, S_q, H, D\), one row per sequence, got \(2, 1, 1, 8\)"):
        cache.decode(torch.randn(2, 1, 1, 8), "ab")  # not sequences 'a' and 'b'


def test_layer_and_sizes_take_integers_only():
    np = pytest.importorskip("numpy")
    cache = PagedKVCache(num_pages=np.int64(8), page_size=4, kv_heads=1, head_dim=8, dtype=torch.float32,
                         num_layers=2)  # fmt: skip
    assert cache.num_pages == 8 and type(cache.num_pages) is int
    cache.allocate("a", 1)
    cache.append("a", torch.ones(1, 1, 1, 8), torch.ones(1, 1, 1, 8), layer=np.int64(1))
    with pytest.raises(ValueError, match=r"layer must be an int in 0..1, got True"):
        cache.decode(torch.randn(1, 1, 1, 8), "a", layer=True)
    with pytest.raises(TypeError, match="k_new must be a torch.Tensor, got list"):
        cache.append("a", [1.0], torch.ones(1, 1, 1, 8), layer=0)


def test_a_tuple_is_one_id_and_counts_take_numpy_integers():
    """Serving code keys sequences by (request, beam): a tuple used to become two sequences."""
    np = pytest.importorskip("numpy")
    cache = PagedKVCache(num_pages=8, page_size=4, kv_heads=1, head_dim=8, dtype=torch.float32)
    cache.allocate(("req", 0), np.int64(2))
    assert cache.seq_len(("req", 0)) == 2 and cache.num_free_pages == 7
    cache.append([("req", 0)], torch.ones(1, 2, 1, 8), torch.ones(1, 2, 1, 8))
    assert cache.decode(torch.randn(1, 1, 1, 8), ("req", 0)).shape == (1, 1, 1, 8)


# ------------------------------------------------------------------ misuse found by the 2026-12-05 review


@pytest.mark.parametrize("dtype", [torch.int64, torch.complex64, torch.bool])
def test_append_refuses_rows_that_are_not_real_floats(dtype):
    """int rows used to be cast into the pool without a word (complex ones lost their imaginary part)."""
    cache = PagedKVCache(num_pages=2, page_size=4, kv_heads=1, head_dim=8, dtype=torch.bfloat16)
    cache.allocate(["s"], 1)
    rows = torch.ones(1, 1, 1, 8, dtype=dtype)
    with pytest.raises(TypeError, match=rf"k_new must be a real floating tensor .* got {dtype}"):
        cache.append(["s"], rows, rows)
    assert torch.count_nonzero(cache.k_pages) == 0
    cache.append(["s"], torch.full((1, 1, 1, 8), 2.0, dtype=torch.float64), torch.ones(1, 1, 1, 8))  # floats cast
    assert torch.equal(cache.gather("s")[0], torch.full((1, 1, 8), 2.0, dtype=torch.bfloat16))


def test_allocate_names_an_unhashable_id_in_a_list():
    cache = PagedKVCache(num_pages=2, page_size=4, kv_heads=1, head_dim=8, dtype=torch.float32)
    with pytest.raises(TypeError, match=r"a sequence id must be hashable, got list \['x'\] in seq_ids"):
        cache.allocate([["x"]], 1)
    assert cache.num_free_pages == 2


@pytest.mark.parametrize(
    "table,lens,page_size,error,match",
    [
        (torch.tensor([[5.9, 0.5]]), torch.tensor([8]), 4, TypeError, "page_table must be int32 or int64, got torch.float32"),
        (torch.tensor([[0, 1]]), torch.tensor([8.9]), 4, TypeError, "seqlens must be int32 or int64, got torch.float32"),
        ([[0, 1]], torch.tensor([8]), 4, TypeError, "page_table must be a torch.Tensor, got list"),
        (torch.tensor([[0, 1]]), torch.tensor([8]), 0, ValueError, "page_size must be a positive int, got 0"),
    ],
)
def test_check_page_table_refuses_what_decode_refuses(table, lens, page_size, error, match):
    """Float tables used to pass (truncated), page_size 0 raised a ZeroDivisionError."""
    with pytest.raises(error, match=match):
        check_page_table(table, 8, lens, page_size=page_size)
