"""Continuous batching end to end: a small random Llama under ``generate_batch`` with
``paged|hfpatch`` (our kv_append + slot decode kernels through ``paged_kernel``) gives the same greedy
tokens as ``paged|sdpa``."""

import pytest
import torch

pytestmark = pytest.mark.gpu
transformers = pytest.importorskip("transformers")


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=512, hidden_size=512, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, max_position_embeddings=1024,
        initializer_range=0.2,  # peaked logits: greedy choices are not near-ties between two runs
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device("cuda"):
        return LlamaForCausalLM(config).to(torch.float16).eval()


def _generate(model, prompts, attn, max_new_tokens):
    from transformers import GenerationConfig

    model.set_attn_implementation(attn)
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.inference_mode():
        results = model.generate_batch(inputs=prompts, generation_config=config)
    return {key: list(r.generated_tokens) for key, r in results.items()}


def test_generate_batch_matches_sdpa(monkeypatch):
    import hf_flashpatch  # noqa: F401  (registers paged|hfpatch)
    from hf_flashpatch.kernels import decode

    model = _tiny_llama()
    if not hasattr(model, "generate_batch"):
        pytest.skip("this transformers has no generate_batch")
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 512, (n,), generator=generator).tolist() for n in (5, 17, 64, 130, 33, 1)]
    expected = _generate(model, prompts, "paged|sdpa", 24)

    calls = {"slot": 0}
    real = decode.slot_varlen_forward

    def counting(*args, **kwargs):
        calls["slot"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(decode, "slot_varlen_forward", counting)
    got = _generate(model, prompts, f"paged|{hf_flashpatch.ATTN_NAME}", 24)
    from packaging.version import Version

    if Version(transformers.__version__) < Version("5.23"):  # later versions dropped the paged| functions
        assert calls["slot"] > 0, "the slot decode kernel was never called"
    assert set(got) == set(expected)
    mismatched = [key for key in expected if got[key] != expected[key]]
    assert not mismatched, {key: (expected[key], got[key]) for key in mismatched}
    assert all(len(tokens) == 24 for tokens in got.values())
