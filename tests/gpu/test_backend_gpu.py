"""The transformers backend on CUDA: a small random Llama in bf16, patched vs ``sdpa``.

Logits of a left-padded batch (real tokens only) stay within twice sdpa's own bf16 error against an
fp32 sdpa run (+ eps); greedy generation with a DynamicCache and a StaticCache matches sdpa's; the
CUDA kernels serve the calls (no fallback warning). Logits and generation run under ``torch.no_grad`` and
inside ``torch.inference_mode`` (inference tensors carry no version counter).
"""

import warnings

import pytest
import torch

from .greedy import first_divergence_is_near_tie

pytestmark = pytest.mark.gpu
pytest.importorskip("transformers")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

DEVICE = "cuda"
LENGTHS = [113, 1, 64, 97]  # awkward lengths, one single-token prompt; left-padded to 113
NEW_TOKENS = 16
FALLBACK_MARK = "CUDA kernel not used"


def tiny_llama(attn_implementation, dtype=torch.bfloat16):
    from transformers import LlamaConfig, LlamaForCausalLM

    import hf_flashpatch  # noqa: F401  (registers the backend)

    config = LlamaConfig(
        vocab_size=512, hidden_size=512, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, max_position_embeddings=1024, pad_token_id=0,
        initializer_range=0.2,  # peaked logits: greedy choices are not near-ties between two backends
    )  # fmt: skip
    return seeded_on_gpu(LlamaForCausalLM, config, attn_implementation, dtype)


def seeded_on_gpu(model_class, config, attn_implementation, dtype):
    """``model_class(config)`` with seed-0 random weights, built on the GPU, in ``dtype``, in eval mode."""
    torch.manual_seed(0)
    with torch.device(DEVICE):
        model = model_class(config)
    model.set_attn_implementation(attn_implementation)
    return model.to(dtype).eval()


def left_padded_batch(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    total = max(lengths)
    ids = torch.zeros(len(lengths), total, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, total - n :] = torch.randint(3, 512, (n,), generator=gen)
        mask[row, total - n :] = 1
    return ids.to(DEVICE), mask.to(DEVICE)


def no_fallback(caught):
    fallbacks = [str(w.message) for w in caught if FALLBACK_MARK in str(w.message)]
    assert not fallbacks, fallbacks


GRAD_MODES = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}


@pytest.mark.parametrize("grad_mode", GRAD_MODES)
def test_padded_logits_within_twice_sdpa_error(grad_mode):
    import hf_flashpatch

    ids, mask = left_padded_batch(LENGTHS)
    model = tiny_llama("sdpa")
    real = mask.bool()
    with GRAD_MODES[grad_mode]():
        sdpa = model(input_ids=ids, attention_mask=mask).logits[real].float()
        exact = model.float()(input_ids=ids, attention_mask=mask).logits[real]
        model.to(torch.bfloat16)
        hf_flashpatch.patch(model)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ours = model(input_ids=ids, attention_mask=mask).logits[real].float()
    no_fallback(caught)
    assert torch.isfinite(ours).all()
    ours_err = (ours - exact).abs().max().item()
    sdpa_err = (sdpa - exact).abs().max().item()
    assert ours_err <= 2 * sdpa_err + 1e-2, (ours_err, sdpa_err)


def test_unpadded_logits_within_twice_sdpa_error():
    import hf_flashpatch

    ids = torch.randint(3, 512, (2, 239), device=DEVICE)
    model = tiny_llama("sdpa")
    with torch.no_grad():
        sdpa = model(input_ids=ids).logits.float()
        exact = model.float()(input_ids=ids).logits
        hf_flashpatch.patch(model.to(torch.bfloat16))
        ours = model(input_ids=ids).logits.float()
    ours_err = (ours - exact).abs().max().item()
    sdpa_err = (sdpa - exact).abs().max().item()
    assert ours_err <= 2 * sdpa_err + 1e-2, (ours_err, sdpa_err)


@pytest.mark.parametrize("grad_mode", GRAD_MODES)
@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("lengths", [LENGTHS, [64, 64]], ids=["left_padded", "no_padding"])
def test_greedy_generate_matches_sdpa(cache, lengths, grad_mode):
    ids, mask = left_padded_batch(lengths, seed=1)
    model = tiny_llama("sdpa")
    kwargs = dict(attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0,
                  eos_token_id=None, cache_implementation=cache)  # fmt: skip
    if cache == "static":  # no CUDA-graph compilation of the decode step: compare the attention, not compile
        kwargs["disable_compile"] = True
    want, got, caught = generate_before_and_after_patch(model, ids, kwargs, GRAD_MODES[grad_mode])
    no_fallback(caught)
    assert got.shape == (len(lengths), max(lengths) + NEW_TOKENS)
    assert_same_greedy(model, got, want, mask)


def generate_before_and_after_patch(model, ids, kwargs, grad_mode=torch.no_grad):
    """``(want, got, caught)``: ``generate`` under the model's own attention, then patched, with the patched
    run's warnings recorded."""
    import hf_flashpatch

    with grad_mode():
        want = model.generate(input_ids=ids, **kwargs)
        hf_flashpatch.patch(model)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = model.generate(input_ids=ids, **kwargs)
    return want, got, caught


def assert_same_greedy(model, got, want, mask):
    """Equal greedy tokens, except that a row may diverge at a near-tie (see ``greedy.py``)."""
    prompt_len = mask.shape[1]
    for row in range(got.shape[0]):
        assert torch.equal(got[row, :prompt_len], want[row, :prompt_len]), "the prompts themselves differ"
        context = got[row, :prompt_len][mask[row].bool()].tolist()  # the real (unpadded) prompt tokens
        ok, where = first_divergence_is_near_tie(
            model, context, got[row, prompt_len:].tolist(), want[row, prompt_len:].tolist()
        )
        assert ok, f"row {row} {where}"


def test_fp32_model_on_gpu_takes_the_torch_fallback():
    """fp32 is documented to run through the torch fallback: correct, with one warning naming why."""
    import hf_flashpatch

    ids, mask = left_padded_batch([17, 9])
    model = tiny_llama("sdpa", dtype=torch.float32)
    real = mask.bool()
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits[real]
        hf_flashpatch.patch(model)
        got = model(input_ids=ids, attention_mask=mask).logits[real]
    torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)
