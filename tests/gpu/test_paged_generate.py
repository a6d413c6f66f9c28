"""Continuous batching end to end: a small random Llama under ``generate_batch`` with our attention gives
the same greedy tokens as transformers' own attention, and the pool routes of
``hf_flashpatch.backend.paged_kernel`` run our kernels:

- transformers < 5.19 (``paged|hfpatch``): kv_append through ``write_index``, the slot decode kernel
  through ``read_index``;
- transformers >= 5.19 (``hfpatch``, run as ``hfpatch-paged`` during the batch): decode-only steps take
  the block-table path (kv_append into the block pool, then the paged decode kernel), captured in CUDA
  graphs with batches padded to a power of 2; the other steps the gathered varlen path.

The cache is small on purpose (pages of 16 tokens, 96 tokens per batch): the 130-token prompt is
prefilled in chunks (queries over cached keys), decode batches run under CUDA graphs with padded
inputs, and pages of different requests interleave in the pool."""

import dataclasses

import pytest
import torch

from .greedy import first_divergence_is_near_tie

pytestmark = pytest.mark.gpu
transformers = pytest.importorskip("transformers")


def _newest() -> bool:
    """transformers >= 5.19: no ``paged|`` functions; continuous batching runs under our own name."""
    from hf_flashpatch.backend.patch import _paged_prefix_supported

    return not _paged_prefix_supported()


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=512, hidden_size=512, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, max_position_embeddings=1024,
        initializer_range=0.2,  # peaked logits: fewer near-ties between implementations
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device("cuda"):
        return LlamaForCausalLM(config).to(torch.float16).eval()


def _prompts():
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(1, 512, (n,), generator=generator).tolist() for n in (5, 17, 64, 130, 33, 1)]


def _generate(model, prompts, attn, max_new_tokens, inference_mode=False, **batching):
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    fields = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
    page = "page_size" if "page_size" in fields else "block_size"  # renamed after 5.17
    if "auto_switch_to_flash" in fields:
        batching.setdefault("auto_switch_to_flash", False)  # keep "sdpa" sdpa even where flash-attn is installed
    model.set_attn_implementation(attn)
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    batching = ContinuousBatchingConfig(**{page: 16}, num_blocks=64, max_batch_tokens=96, max_requests_per_batch=4,
                                        **batching)  # fmt: skip
    # transformers <= 5.23 fails inside inference_mode with its own attention too: its batching thread updates
    # tensors that the manager creates on this thread.
    with torch.inference_mode(inference_mode):
        results = model.generate_batch(inputs=prompts, generation_config=config, continuous_batching_config=batching)
    tokens = {key: list(r.generated_tokens) for key, r in results.items()}
    assert len(tokens) == len(prompts) and all(len(t) == max_new_tokens for t in tokens.values()), (
        f"{attn}: generation failed or stopped early: {tokens}"
    )
    return tokens


def _count_successes(monkeypatch, module, names):
    """Count the calls of ``module.<name>`` that return (a kernel that declines raises before launching)."""
    calls = dict.fromkeys(names, 0)
    for name in names:
        real = getattr(module, name)

        def counting(*args, _name=name, _real=real, **kwargs):
            out = _real(*args, **kwargs)
            calls[_name] += 1
            return out

        monkeypatch.setattr(module, name, counting)
    return calls


def _check_against_references(model, prompts, ours, refs):
    """Two correct implementations may flip a greedy near-tie; any divergence from sdpa must be one."""
    sdpa, eager = refs
    for key in sdpa:
        prompt = prompts[int(key.rsplit("_", 1)[-1])]  # request ids are "req_<index into prompts>"
        ok, where = first_divergence_is_near_tie(model, prompt, ours[key], sdpa[key])
        assert ok, f"{key}: ours vs sdpa {where} (eager: {eager[key] == ours[key]})"
    assert sum(ours[key] == sdpa[key] for key in sdpa) >= len(sdpa) - 1


def test_generate_batch_matches_transformers_paged_attention(monkeypatch):
    import hf_flashpatch
    from hf_flashpatch.kernels import decode

    if _newest():
        pytest.skip(f"transformers {transformers.__version__} has no paged| attention functions")
    model = _tiny_llama()
    prompts = _prompts()
    refs = _generate(model, prompts, "paged|sdpa", 24), _generate(model, prompts, "paged|eager", 24)
    calls = _count_successes(monkeypatch, decode, ["kv_append", "slot_varlen_forward"])
    ours = _generate(model, prompts, f"paged|{hf_flashpatch.ATTN_NAME}", 24)
    assert calls["slot_varlen_forward"] > 0, "the slot decode kernel was never called"
    assert calls["kv_append"] > 0, "the kv_append kernel was never called"
    _check_against_references(model, prompts, ours, refs)


@pytest.mark.parametrize("inference_mode", [False, True], ids=["no_grad", "inference_mode"])
@pytest.mark.parametrize("route", ["block_table", "gathered"])
def test_generate_batch_block_table_route_matches_sdpa(monkeypatch, route, inference_mode):
    """transformers >= 5.19: the block-table decode path with our kernels, and with it turned off by the
    caller (``max_blocks_per_request=0``) the gathered varlen path, against sdpa and paged|eager."""
    import hf_flashpatch
    from hf_flashpatch.kernels import decode

    from packaging.version import Version

    if not _newest():
        pytest.skip(f"transformers {transformers.__version__} calls paged|<name> (the other test)")
    if inference_mode and Version(transformers.__version__) < Version("5.24"):
        pytest.skip(f"transformers {transformers.__version__} fails inside inference_mode with its own attention too")
    model = _tiny_llama()
    prompts = _prompts()
    refs = _generate(model, prompts, "sdpa", 24), _generate(model, prompts, "paged|eager", 24)
    calls = _count_successes(monkeypatch, decode, ["kv_append", "paged_decode_forward"])
    off = dict(max_blocks_per_request=0) if route == "gathered" else {}
    ours = _generate(model, prompts, hf_flashpatch.ATTN_NAME, 24, inference_mode=inference_mode, **off)
    assert model.config._attn_implementation == hf_flashpatch.ATTN_NAME  # restored after the batch
    if route == "block_table":
        assert calls["paged_decode_forward"] > 0, "the paged decode kernel was never called"
        assert calls["kv_append"] == calls["paged_decode_forward"], calls  # one append per block-table call
    else:
        assert calls == {"kv_append": 0, "paged_decode_forward": 0}, calls
    _check_against_references(model, prompts, ours, refs)
