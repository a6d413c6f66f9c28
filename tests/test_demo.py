"""The demo: on a tiny local checkpoint (fast; also its failure exit) and on the real SmolLM2-135M
(GGUF, ~30 s on a 2-core CPU): patched logits match sdpa on a left-padded batch, it generates."""

import re

import pytest
import torch
from real_model import require_smollm2

import hf_flashpatch.api
from hf_flashpatch.demo import FP32_ATOL, main

WORDS = "the a of and to in is was it for on with as by at from that this be are".split()


def save_tiny_checkpoint(folder, *, with_tokenizer: bool = True) -> str:
    """Save a tiny random Llama (and a word-level tokenizer) as a local checkpoint folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, "[EOS]": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]",
                                        eos_token="[EOS]")  # fmt: skip
    if with_tokenizer:
        tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, eos_token_id=2)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny_checkpoint"))


PROMPTS = ["--prompt", "the cat was in the house", "--prompt", "it is"]


def test_demo_on_a_local_checkpoint(tiny_checkpoint, capsys):
    status = main(["--model", tiny_checkpoint, "--device", "cpu", "--max-new-tokens", "3", *PROMPTS])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "lengths [6, 2]" in out
    assert float(re.search(r"max abs diff ([0-9.e+-]+)", out).group(1)) <= FP32_ATOL
    assert "generated 6 tokens (2 x 3)" in out


def test_demo_fails_when_logits_disagree(tiny_checkpoint, capsys, monkeypatch):
    """A wrong attention (outputs scaled by 1.5) must give a non-zero exit status."""
    for name in ("flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"):
        original = getattr(hf_flashpatch.api, name)
        monkeypatch.setattr(hf_flashpatch.api, name, lambda *a, _f=original, **k: _f(*a, **k) * 1.5)
    status = main(["--model", tiny_checkpoint, "--device", "cpu", "--max-new-tokens", "2", *PROMPTS])
    out = capsys.readouterr().out
    assert status == 1, out
    assert "FAIL" in out


def test_demo_reports_a_missing_model(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", "/nonexistent/checkpoint", "--device", "cpu"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err == "hf-flashpatch demo: error: argument --model: no such folder: /nonexistent/checkpoint\n"


@pytest.mark.slow
def test_demo_on_smollm2_cpu(capsys):
    require_smollm2()
    status = main(["--device", "cpu", "--dtype", "float32", "--max-new-tokens", "4",
                   "--prompt", "The capital of France is", "--prompt", "Once upon a time, in a small village, there"])
    out = capsys.readouterr().out
    assert status == 0, out
    diff = float(re.search(r"max abs diff ([0-9.e+-]+)", out).group(1))
    assert 0.0 <= diff <= FP32_ATOL
    assert "greedy next token agrees for 2/2 prompts" in out
    lengths = [int(n) for n in re.search(r"lengths \[([0-9, ]+)\]", out).group(1).split(",")]
    assert len(set(lengths)) == 2  # prompts of different lengths: a real left-padded batch
    assert re.search(r"generated 8 tokens \(2 x 4\) in [0-9.]+ s: [0-9.]+ tokens/s", out)
    assert "attention path: torch fallback (tensor is on cpu)" in out
