"""Generation through the backend on CPU: greedy ``generate`` with DynamicCache and StaticCache, and
continuous batching (``generate_batch``, ``generate(cache_implementation="paged")``), against ``sdpa``."""

import inspect

import pytest
import torch
from test_backend import NAME, padded_batch, tiny_model, twin_models
from transformers import GenerationConfig, StaticCache
from transformers.generation.configuration_utils import ContinuousBatchingConfig

import hf_flashpatch.api
import hf_flashpatch.backend.paged as paged_module
from hf_flashpatch.backend.patch import _paged_prefix_supported

NEW_TOKENS = 8


def greedy(model, ids, mask, **kwargs):
    return model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0,
        eos_token_id=None, **kwargs,
    )  # fmt: skip


@pytest.fixture
def api_calls(monkeypatch):
    """Counts calls into the public API made by the backend (the functions it reaches through ``api``)."""
    counts = {"varlen": 0, "func": 0, "kvcache": 0, "paged_torch": 0}

    def spy(key, original):
        def wrapper(*args, **kwargs):
            counts[key] += 1
            return original(*args, **kwargs)

        return wrapper

    api = hf_flashpatch.api
    monkeypatch.setattr(api, "flash_attn_varlen_func", spy("varlen", api.flash_attn_varlen_func))
    monkeypatch.setattr(api, "flash_attn_func", spy("func", api.flash_attn_func))
    monkeypatch.setattr(api, "flash_attn_with_kvcache", spy("kvcache", api.flash_attn_with_kvcache))
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


def small_pool():
    """A small page pool: by default it is sized from free memory, which takes long to allocate on a CPU."""
    return ContinuousBatchingConfig(num_blocks=16, max_batch_tokens=64)


PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16, 17, 18, 19], [20, 21]]


def batch_generate(model):
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)
    results = model.generate_batch(
        inputs=PROMPTS, generation_config=config, continuous_batching_config=small_pool(), progress_bar=False
    )
    by_prompt = {tuple(r.prompt_ids): list(r.generated_tokens) for r in results.values()}
    return [by_prompt[tuple(p)] for p in PROMPTS]


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2"])
def test_generate_batch_matches_sdpa(kind, api_calls):
    ours, ref = twin_models(kind)
    got = batch_generate(ours)
    assert api_calls["varlen"] >= ours.config.num_hidden_layers * NEW_TOKENS  # every step ran our varlen call
    if _paged_prefix_supported():  # transformers < 5.23 calls paged|<name>
        assert api_calls["paged_torch"] >= ours.config.num_hidden_layers * NEW_TOKENS
    assert ours.config._attn_implementation == NAME  # restored after the batch
    assert all(len(tokens) == NEW_TOKENS for tokens in got)
    assert got == batch_generate(ref)


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
