"""Generation through the backend on CPU: greedy ``generate`` with DynamicCache and StaticCache, and
continuous batching (``generate_batch``, ``generate(cache_implementation="paged")``), against ``sdpa``.

Continuous batching has two routes (:mod:`hf_flashpatch.backend.paged`): the gathered one (transformers
gathers each sequence's K/V, our varlen call runs on them) and the pool routes of
:mod:`hf_flashpatch.backend.paged_kernel` (write the new K/V into the pool, attend through its slots
(< 5.19) or block table (>= 5.19)). The pool routes serve where the kernels can run; here they are
forced on and off through ``paged_kernel.kernels_unavailable_reason`` and run with the API's torch
fallback, so the routing is checked on CPU."""

import inspect

import pytest
import torch
from test_backend import NAME, padded_batch, tiny_model, twin_models
from transformers import GenerationConfig, StaticCache
from transformers.generation.configuration_utils import ContinuousBatchingConfig

import hf_flashpatch.api
import hf_flashpatch.backend.paged as paged_module
from hf_flashpatch.backend import paged_kernel
from hf_flashpatch.backend.attention import layer_sliding_window
from hf_flashpatch.backend.patch import _paged_prefix_supported
from hf_flashpatch.reference import paged_decode_reference

NEW_TOKENS = 8


def greedy(model, ids, mask, **kwargs):
    return model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0,
        eos_token_id=None, **kwargs,
    )  # fmt: skip


@pytest.fixture
def api_calls(monkeypatch):
    """Counts calls into the public API made by the backend (the functions it reaches through ``api``)."""
    counts = {"varlen": 0, "func": 0, "kvcache": 0, "paged_torch": 0, "kv_append": 0, "slot": 0, "block_table": 0}

    def spy(key, original):
        def wrapper(*args, **kwargs):
            counts[key] += 1
            return original(*args, **kwargs)

        return wrapper

    api = hf_flashpatch.api
    monkeypatch.setattr(api, "flash_attn_varlen_func", spy("varlen", api.flash_attn_varlen_func))
    monkeypatch.setattr(api, "flash_attn_func", spy("func", api.flash_attn_func))
    monkeypatch.setattr(api, "flash_attn_with_kvcache", spy("kvcache", api.flash_attn_with_kvcache))
    monkeypatch.setattr(api, "kv_append", spy("kv_append", api.kv_append))
    monkeypatch.setattr(api, "flash_attn_slot_varlen_func", spy("slot", api.flash_attn_slot_varlen_func))
    monkeypatch.setattr(api, "flash_attn_paged_decode", spy("block_table", api.flash_attn_paged_decode))
    monkeypatch.setattr(paged_module, "paged_attention_forward_torch",
                        spy("paged_torch", paged_module.paged_attention_forward_torch))  # fmt: skip
    return counts


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2"])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_left_padded_greedy_matches_sdpa(kind, cache, api_calls):
    ours, ref = twin_models(kind)
    ids, mask = padded_batch([9, 4, 7], 9, seed=3)
    got = greedy(ours, ids, mask, cache_implementation=cache)
    want = greedy(ref, ids, mask, cache_implementation=cache)
    assert got.shape == (3, 9 + NEW_TOKENS)
    assert torch.equal(got, want), (got, want)
    assert api_calls["varlen"] > 0  # padded prefill and decode are unpadded into varlen


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2"])
def test_unpadded_static_cache_matches_sdpa(kind):
    """No padding, so no mask: the static buffer's unwritten slots must still be cut off."""
    ours, ref = twin_models(kind)
    ids = torch.randint(3, 128, (2, 5))
    mask = torch.ones_like(ids)
    assert torch.equal(greedy(ours, ids, mask, cache_implementation="static"), greedy(ref, ids, mask))
    # a plain forward into a fresh StaticCache, without any attention mask
    name = "cache" if "cache" in inspect.signature(ours.forward).parameters else "past_key_values"  # 5.23+: cache
    cached = [m(input_ids=ids, **{name: StaticCache(config=m.config, max_cache_len=16)}) for m in (ours, ref)]
    got, want = (out.logits for out in cached)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_unpadded_decode_takes_the_kvcache_path(api_calls):
    ours, ref = twin_models("llama")
    ids = torch.randint(3, 128, (2, 6))
    mask = torch.ones_like(ids)
    assert torch.equal(greedy(ours, ids, mask), greedy(ref, ids, mask))
    layers = ours.config.num_hidden_layers
    assert api_calls["func"] == layers  # prefill
    assert api_calls["kvcache"] == layers * (NEW_TOKENS - 1)  # one new token per step over the cache


def small_pool(**overrides):
    """A small page pool: by default it is sized from free memory, which takes long to allocate on a CPU."""
    return ContinuousBatchingConfig(num_blocks=16, max_batch_tokens=64, **overrides)


@pytest.fixture(params=["gathered", "pool"])
def route(request, monkeypatch):
    """Continuous batching with the pool routes forced off ("gathered") or on ("pool", through the API's
    torch fallback on CPU), whatever this machine has."""
    reason = None if request.param == "pool" else "turned off by the test"
    monkeypatch.setattr(paged_kernel, "kernels_unavailable_reason", lambda tensor: reason)
    return request.param


PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16, 17, 18, 19], [20, 21]]


def batch_generate(model, **pool):
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)
    results = model.generate_batch(
        inputs=PROMPTS, generation_config=config, continuous_batching_config=small_pool(**pool), progress_bar=False
    )
    by_prompt = {tuple(r.prompt_ids): list(r.generated_tokens) for r in results.values()}
    # failed requests come back missing or short, without an exception
    failed = [p for p in PROMPTS if len(by_prompt.get(tuple(p), ())) != NEW_TOKENS]
    if failed:
        raise RuntimeError(f"generate_batch did not return {NEW_TOKENS} tokens for prompts {failed}")
    return [by_prompt[tuple(p)] for p in PROMPTS]


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2"])
def test_generate_batch_matches_sdpa(kind, route, api_calls):
    """Same tokens as sdpa on either route, and each step took the route it should: the pool routes serve
    full-attention layers (llama); sliding-window layers (mistral, qwen2 here) keep the gathered route."""
    ours, ref = twin_models(kind)
    got = batch_generate(ours)
    layers = ours.config.num_hidden_layers
    pooled = route == "pool" and kind == "llama"
    decode_steps = layers * (NEW_TOKENS - 1)  # the first new token comes out of the prefill step
    if not pooled:
        assert api_calls["varlen"] >= layers * NEW_TOKENS  # every step ran our varlen call
        assert api_calls["kv_append"] == api_calls["slot"] == api_calls["block_table"] == 0
        if _paged_prefix_supported():  # transformers < 5.19 calls paged|<name>
            assert api_calls["paged_torch"] >= layers * NEW_TOKENS
    elif _paged_prefix_supported():  # < 5.19: paged|<name> writes through write_index, reads through read_index
        assert api_calls["slot"] >= decode_steps and api_calls["kv_append"] >= api_calls["slot"]
        assert api_calls["paged_torch"] == api_calls["block_table"] == 0
    else:  # >= 5.19: every decode step is a block-table call: one append and one paged decode per layer
        assert api_calls["block_table"] >= decode_steps and api_calls["kv_append"] == api_calls["block_table"]
        assert api_calls["varlen"] >= layers  # the prefill
        assert api_calls["slot"] == 0
    assert ours.config._attn_implementation == NAME  # restored after the batch
    assert all(len(tokens) == NEW_TOKENS for tokens in got)
    assert got == batch_generate(ref)


@pytest.mark.skipif(_paged_prefix_supported(), reason="the block-table decode path is transformers >= 5.19's")
def test_block_table_path_stays_off_when_the_caller_turns_it_off(api_calls, monkeypatch):
    monkeypatch.setattr(paged_kernel, "kernels_unavailable_reason", lambda tensor: None)
    ours, ref = twin_models("llama")
    assert batch_generate(ours, max_blocks_per_request=0) == batch_generate(ref)
    assert api_calls["block_table"] == api_calls["kv_append"] == 0


@pytest.mark.skipif(_paged_prefix_supported(), reason="the block-table decode path is transformers >= 5.19's")
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_decode_fast_path_check_for_our_name(kind, monkeypatch):
    """transformers keeps its block-table decode path only for flash-attn; for our continuous-batching name it
    stays on where our route can serve it, and goes off for sliding-window layers or without the kernels."""
    from transformers.generation.continuous_batching import initialization

    from hf_flashpatch.backend.patch import continuous_batching_name

    model = tiny_model(kind)
    model.set_attn_implementation(continuous_batching_name(NAME))
    for reason, want in ((None, 6 if kind == "llama" else 0), ("no kernels", 0)):
        monkeypatch.setattr(paged_kernel, "kernels_unavailable_reason", lambda tensor, r=reason: r)
        cb_config = ContinuousBatchingConfig(max_blocks_per_request=6)
        initialization.ensure_decode_fast_path_is_available(model.config, cb_config, True)
        assert cb_config.max_blocks_per_request == want, (reason, cb_config.max_blocks_per_request)
    model.set_attn_implementation("sdpa")  # not ours: transformers' own verdict (no flash-attn: off)
    cb_config = ContinuousBatchingConfig(max_blocks_per_request=6)
    initialization.ensure_decode_fast_path_is_available(model.config, cb_config, False)
    assert cb_config.max_blocks_per_request == 0


@pytest.mark.skipif(_paged_prefix_supported(), reason="the block-table decode path is transformers >= 5.19's")
def test_block_table_plan_is_made_once_per_step(monkeypatch):
    """Sequence lengths and write slots are the same for every layer of a decode step: made by its first layer."""
    monkeypatch.setattr(paged_kernel, "kernels_unavailable_reason", lambda tensor: None)
    plans = []
    real = paged_kernel._block_table_plan
    monkeypatch.setattr(paged_kernel, "_block_table_plan", lambda *args: plans.append(1) or real(*args))
    ours, ref = twin_models("llama")
    assert batch_generate(ours) == batch_generate(ref)
    assert len(plans) == NEW_TOKENS - 1  # one per decode step, not one per layer


def test_pool_route_in_inference_mode(route, api_calls):
    """Up to transformers 5.23 the batching thread runs outside inference_mode and cannot update the tensors made
    inside it, for any attention: the test then skips, naming the reference's failure."""
    ours, ref = twin_models("llama")
    with torch.inference_mode():
        try:
            want = batch_generate(ref)
        except RuntimeError as error:  # batch_generate's: the requests failed
            pytest.skip(f"transformers' sdpa cannot generate_batch inside inference_mode here: {error}")
        got = batch_generate(ours)
    assert got == want and all(len(tokens) == NEW_TOKENS for tokens in got)
    assert (api_calls["kv_append"] > 0) == (route == "pool")


def _block_table_call(dtype=torch.float32):
    """A decode step as transformers >= 5.19 hands it over: 3 sequences of 5, 1 and 9 keys (the new one
    included) in pages of 4, then 2 padding sequences (length 0, table rows of -1), as in a CUDA-graph
    batch padded to a power of 2."""
    num_pages, page_size, heads, kv_heads, dim = 10, 4, 4, 2, 16
    k_pages, v_pages = torch.randn(num_pages, page_size, kv_heads, dim, dtype=dtype), torch.randn(
        num_pages, page_size, kv_heads, dim, dtype=dtype
    )
    table = torch.full((5, 3), -1, dtype=torch.int32)  # (B, max_pages)
    table[0, :2] = torch.tensor([7, 2])
    table[1, :1] = torch.tensor([5])
    table[2, :3] = torch.tensor([0, 9, 4])
    lengths = [5, 1, 9, 0, 0]
    cu_k = torch.tensor([0, 5, 6, 15, 15, 15], dtype=torch.int32)
    query = torch.randn(1, heads, 5, dim, dtype=dtype)  # (1, H, B, D): one new token per sequence
    key, value = torch.randn(1, kv_heads, 5, dim, dtype=dtype), torch.randn(1, kv_heads, 5, dim, dtype=dtype)
    kwargs = dict(block_table=table, k_cache=k_pages, v_cache=v_pages, cu_seq_lens_k=cu_k, cu_seq_lens_q=cu_k,
                  max_length_q=1, max_length_k=1, is_causal=True)  # fmt: skip
    return query, key, value, kwargs, lengths


def test_block_table_call_writes_the_new_token_and_reads_the_pages(api_calls):
    query, key, value, kwargs, lengths = _block_table_call()
    k_pages, v_pages, table = kwargs["k_cache"], kwargs["v_cache"], kwargs["block_table"]
    k_before, v_before = k_pages.clone(), v_pages.clone()
    module = torch.nn.Module()
    out, weights = paged_module.continuous_batching_forward(module, query, key, value, None, scaling=0.3, **kwargs)
    assert weights is None and out.shape == (1, 5, 4, 16) and out.is_contiguous()
    # The new token of sequence b goes to position lengths[b] - 1 of its pages; padding writes nothing.
    want_k, want_v = k_before.clone(), v_before.clone()
    for b, n in enumerate(lengths[:3]):
        page, offset = int(table[b, (n - 1) // 4]), (n - 1) % 4
        want_k[page, offset], want_v[page, offset] = key[0, :, b], value[0, :, b]
    assert torch.equal(k_pages, want_k) and torch.equal(v_pages, want_v)
    ref, _ = paged_decode_reference(query[0].transpose(0, 1)[:3, None], want_k, want_v, table[:3],
                                    torch.tensor(lengths[:3]), causal=True, softmax_scale=0.3)  # fmt: skip
    torch.testing.assert_close(out[0, :3], ref[:, 0], atol=1e-5, rtol=1e-5)
    assert torch.all(out[0, 3:] == 0)  # padding sequences see no key
    assert api_calls["kv_append"] == api_calls["block_table"] == 1 and api_calls["varlen"] == 0


def test_block_table_call_casts_into_the_pool_dtype():
    """q/k/v may arrive in fp32 (autocast, fp32 layer norms) while the pool is in the model's dtype."""
    query, key, value, kwargs, lengths = _block_table_call(torch.bfloat16)
    out, _ = paged_module.continuous_batching_forward(
        torch.nn.Module(), query.float(), key.float(), value.float(), None, **kwargs
    )
    assert out.dtype == torch.bfloat16
    assert torch.equal(kwargs["k_cache"][2, 0], key[0, :, 0])  # sequence 0's 5th token: its 2nd page (2), offset 0


def test_generate_batch_matches_one_prompt_at_a_time():
    model = tiny_model("llama")
    got = batch_generate(model)
    for prompt, tokens in zip(PROMPTS, got):
        alone = greedy(model, torch.tensor([prompt]), torch.ones(1, len(prompt), dtype=torch.long))
        assert alone[0, len(prompt):].tolist() == tokens


def test_paged_cache_generate_matches_sdpa(api_calls):
    """``generate(cache_implementation="paged")`` hands the rows to continuous batching as they are (it
    ignores the attention mask), so the prompts here are unpadded."""
    ours, ref = twin_models("qwen2")
    ids = torch.randint(3, 128, (2, 9))
    mask = torch.ones_like(ids)
    paged = dict(cache_implementation="paged", continuous_batching_config=small_pool())
    got = greedy(ours, ids, mask, **paged)
    assert api_calls["varlen"] >= ours.config.num_hidden_layers * NEW_TOKENS
    assert torch.equal(got.view(2, -1), greedy(ref, ids, mask, **paged).view(2, -1))
    assert torch.equal(got.view(2, -1), greedy(ours, ids, mask))  # and the same as with a DynamicCache


def test_paged_function_needs_a_cache():
    q, k = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8)
    with pytest.raises(ValueError, match="without a paged cache"):
        paged_module.paged_attention_forward(torch.nn.Module(), q, k, k, None)


def test_block_table_call_folds_attention_sinks_in():
    """GPT-OSS's ``s_aux`` on the block-table route: its decode used to refuse them mid-run (after the prefill)."""
    query, key, value, kwargs, lengths = _block_table_call()
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])  # (H,)
    k_pages, v_pages, table = kwargs["k_cache"], kwargs["v_cache"], kwargs["block_table"]
    out, _ = paged_module.continuous_batching_forward(torch.nn.Module(), query, key, value, None, scaling=0.3,
                                                      s_aux=sinks, **kwargs)  # fmt: skip
    ref, _ = paged_decode_reference(query[0].transpose(0, 1)[:3, None], k_pages, v_pages, table[:3],
                                    torch.tensor(lengths[:3]), causal=True, softmax_scale=0.3, sinks=sinks)  # fmt: skip
    torch.testing.assert_close(out[0, :3], ref[:, 0], atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(_paged_prefix_supported(), reason="the block-table decode path is transformers >= 5.19's")
def test_generate_batch_with_sinks_on_the_block_table_route(api_calls, monkeypatch):
    """A sink model whose layers are all full attention keeps the block-table route on: each prompt's tokens as
    its greedy generate alone."""
    from architecture_matrix import tiny_config
    from transformers import AutoModelForCausalLM

    import hf_flashpatch

    monkeypatch.setattr(paged_kernel, "kernels_unavailable_reason", lambda tensor: None)
    config = tiny_config("gpt_oss")
    config.layer_types = ["full_attention"] * config.num_hidden_layers
    torch.manual_seed(0)
    model = hf_flashpatch.patch(AutoModelForCausalLM.from_config(config).eval())
    got = batch_generate(model)
    assert api_calls["block_table"] >= config.num_hidden_layers * (NEW_TOKENS - 1)
    for prompt, tokens in zip(PROMPTS, got):
        alone = greedy(model, torch.tensor([prompt]), torch.ones(1, len(prompt), dtype=torch.long))
        assert alone[0, len(prompt):].tolist() == tokens


def test_generate_batch_with_a_head_dim_past_the_kernels(route):
    """Head dim 320: every request FAILED ('head_dim must be in 1..256') on transformers 5.17, and after its
    prefill on the >= 5.19 pool route, where paged|sdpa and plain generate serve it. Now transformers' sdpa serves
    it, with one warning, on every route."""
    ours, ref = twin_models("llama", head_dim=320)
    got = batch_generate(ours)
    assert all(len(tokens) == NEW_TOKENS for tokens in got)
    assert got == batch_generate(ref)


class _LayerTypedCache:
    """A paged cache as transformers 5.19+ hands it over, for one layer of full attention: ``update`` picks the
    layer type's ``cu_seq_lens_k`` / ``max_length_k`` out of their dicts in ``kwargs`` (in place) and returns each
    sequence's cached K/V followed by its new rows, ``(1, H_kv, T_k, D)``. Counts its calls."""

    def __init__(self, past_k, past_v, new_per_sequence):
        self.past_k, self.past_v, self.new_per_sequence, self.updates = past_k, past_v, new_per_sequence, 0

    def update(self, key_states, value_states, layer_idx, kwargs):
        self.updates += 1
        kwargs["cu_seq_lens_k"] = kwargs["cu_seq_lens_k"]["full_attention"]
        kwargs["max_length_k"] = kwargs["max_length_k"]["full_attention"]
        parts_k, parts_v, start = [], [], 0
        for past_k, past_v, new in zip(self.past_k, self.past_v, self.new_per_sequence):
            parts_k += [past_k, key_states[:, :, start:start + new]]
            parts_v += [past_v, value_states[:, :, start:start + new]]
            start += new
        return torch.cat(parts_k, dim=2), torch.cat(parts_v, dim=2)  # (1, H_kv, T_k, D)


def test_the_attention_function_updates_the_paged_cache_where_the_model_did_not(monkeypatch):
    """transformers 5.19-5.23 leave the paged cache's update to the attention function (this layer's tables still
    in per-layer-type dicts); from 5.24 the model calls it first. Ours updates it exactly where the model did not,
    and hands transformers' own functions (its fallback) a call that does not update it again."""
    ours, _ = twin_models("llama")
    module = ours.model.layers[0].self_attn
    heads, kv_heads, head_dim = module.config.num_attention_heads, module.config.num_key_value_heads, module.head_dim
    gen = torch.Generator().manual_seed(0)
    past = [3, 5]  # cached tokens per sequence; one new token each
    past_k = [torch.randn(1, kv_heads, n, head_dim, generator=gen) for n in past]
    past_v = [torch.randn(1, kv_heads, n, head_dim, generator=gen) for n in past]
    q = torch.randn(1, heads, 2, head_dim, generator=gen)  # (1, H, T_q, D)
    k_new, v_new = (torch.randn(1, kv_heads, 2, head_dim, generator=gen) for _ in range(2))
    cu_q, cu_k = torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([0, 4, 10], dtype=torch.int32)
    want = []
    for s in range(2):  # each sequence alone: its cached keys and its new one, the new query seeing all of them
        keys = torch.cat([past_k[s], k_new[:, :, s:s + 1]], dim=2).transpose(1, 2)  # (1, S_k, H_kv, D)
        values = torch.cat([past_v[s], v_new[:, :, s:s + 1]], dim=2).transpose(1, 2)
        want.append(hf_flashpatch.api.flash_attn_func(q[:, :, s:s + 1].transpose(1, 2), keys, values, causal=True,
                                                      softmax_scale=module.scaling))  # fmt: skip
    want = torch.cat(want, dim=1)  # (1, T_q, H, D)
    handed_on = []  # the keywords the backend's attention function receives
    real = paged_module.attention_forward
    monkeypatch.setattr(paged_module, "attention_forward",
                        lambda *args, **kw: handed_on.append(kw) or real(*args, **kw))  # fmt: skip
    cache = _LayerTypedCache(past_k, past_v, [1, 1])
    by_type = dict(cu_seq_lens_q=cu_q, max_length_q=1, cu_seq_lens_k={"full_attention": cu_k},
                   max_length_k={"full_attention": 6})  # fmt: skip
    got, _ = paged_module.continuous_batching_forward(module, q, k_new, v_new, None, scaling=module.scaling,
                                                      cache=cache, **by_type)  # fmt: skip
    assert cache.updates == 1 and "cache" not in handed_on[-1]  # a fallback to transformers' own does not update
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    selected = dict(by_type)
    keys, values = cache.update(k_new, v_new, 0, selected)  # the model's update (5.24 on)
    again, _ = paged_module.continuous_batching_forward(module, q, keys, values, None, scaling=module.scaling,
                                                        cache=cache, **selected)  # fmt: skip
    assert cache.updates == 2  # the model's, none in the attention function
    torch.testing.assert_close(again, want, atol=1e-5, rtol=1e-5)


def test_a_layer_takes_the_window_its_call_passes_not_its_modules():
    """EXAONE 4 keeps the config's sliding window on every layer's module and passes ``sliding_window`` to its sliding
    layers only (None to the full ones): the ``paged|`` routes of transformers < 5.19 gave its full layers a window,
    and generate_batch wrong tokens. The call's keyword decides where it is passed; the module's only where not."""
    module = torch.nn.Module()
    module.sliding_window = 6
    assert layer_sliding_window(module, {"sliding_window": None}) is None  # a full layer
    assert layer_sliding_window(module, {"sliding_window": 6}) == 6
    assert layer_sliding_window(module, {}) == 6  # Mistral-like calls on 5.17 pass none
    query = torch.zeros(1, 4, 3, 16)
    cache = type("Cache", (), {"layer_index_to_group_indices": {0: (0, 0)}, "key_cache": [torch.zeros(8, 2, 16)],
                               "value_cache": [torch.zeros(8, 2, 16)], "sliding_windows": {}})()  # fmt: skip
    module.layer_idx = 0
    full = paged_kernel.slot_route_declines(module, query, query, dict(cache=cache, sliding_window=None))
    assert full is None or "sliding" not in full  # (None where the kernels run; on CPU the reason says so)
    assert "sliding" in paged_kernel.slot_route_declines(module, query, query, dict(cache=cache, sliding_window=6))
