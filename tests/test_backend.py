"""The transformers backend on CPU: tiny random Llama / Mistral / Qwen2, patched vs transformers' ``sdpa``.

Forward passes with left and right padding (compared at real tokens only), sliding windows shorter than
the sequence, mixed dtypes, the mask registration, and the errors for what the backend refuses.
"""

import pytest
import torch
from transformers import AttentionInterface, AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config
from transformers.masking_utils import AttentionMaskInterface

import hf_flashpatch
import hf_flashpatch.api
from hf_flashpatch.backend import UnsupportedAttentionFeature, attention_forward

NAME = hf_flashpatch.ATTN_NAME
VOCAB = 128


def tiny_config(kind: str, **overrides):
    """hidden 64, 2 layers, 4 query heads over 2 KV heads (GQA), head dim 16."""
    common = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        tie_word_embeddings=False,
    )  # fmt: skip
    if kind == "llama":
        config = LlamaConfig(**common)
    elif kind == "mistral":
        config = MistralConfig(**common, sliding_window=7)  # shorter than the test sequences
    elif kind == "qwen2":  # biases on q/k/v; sliding window on every layer
        config = Qwen2Config(**common, use_sliding_window=True, sliding_window=6, max_window_layers=0,
                             layer_types=["sliding_attention", "sliding_attention"])  # fmt: skip
    else:
        raise ValueError(kind)
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def tiny_model(kind: str, attn_implementation: str = NAME, dtype=torch.float32, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(kind, **overrides), attn_implementation=attn_implementation)
    return model.to(dtype).eval()


def twin_models(kind: str, dtype=torch.float32, **overrides):
    """The same random weights under our backend and under sdpa."""
    ours = tiny_model(kind, NAME, dtype, **overrides)
    ref = tiny_model(kind, "sdpa", dtype, **overrides)
    ref.load_state_dict(ours.state_dict())
    return ours, ref


def padded_batch(lengths, total, side="left", seed=1):
    """Token ids ``(B, total)`` and the 0/1 mask; real tokens are random ids >= 3 (0 is the pad id)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(lengths), total, dtype=torch.long)
    mask = torch.zeros(len(lengths), total, dtype=torch.long)
    for row, length in enumerate(lengths):
        span = slice(total - length, total) if side == "left" else slice(0, length)
        ids[row, span] = torch.randint(3, VOCAB, (length,), generator=gen)
        mask[row, span] = 1
    return ids, mask


def test_registered_under_our_name():
    assert AttentionInterface._global_mapping[NAME] is attention_forward
    assert f"paged|{NAME}" in AttentionInterface._global_mapping
    assert NAME in AttentionMaskInterface._global_mapping
    model = tiny_model("llama")
    assert model.config._attn_implementation == NAME


def test_patch_switches_a_loaded_model_and_back():
    model = tiny_model("llama", "sdpa")
    assert hf_flashpatch.patch(model) is model
    assert model.config._attn_implementation == NAME
    assert all(m.config._attn_implementation == NAME for m in model.modules() if hasattr(m, "config"))
    model.set_attn_implementation("sdpa")
    assert model.config._attn_implementation == "sdpa"


def test_from_pretrained_with_our_name(tmp_path):
    saved = tiny_model("qwen2", "sdpa")
    saved.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation=NAME).eval()
    assert loaded.config._attn_implementation == NAME
    ids, mask = padded_batch([8, 5], 8)
    with torch.no_grad():
        got, want = (m(input_ids=ids, attention_mask=mask).logits for m in (loaded, saved))
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("bad", ["flash_mine", "my_sdpa", "a/b", ""])
def test_reserved_names_refused(bad):
    from hf_flashpatch.backend import check_name

    with pytest.raises(ValueError, match="name"):
        check_name(bad)


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_forward_matches_sdpa(kind, side):
    ours, ref = twin_models(kind)
    ids, mask = padded_batch([17, 9, 3, 12], 17, side=side)
    with torch.no_grad():
        got = ours(input_ids=ids, attention_mask=mask).logits
        want = ref(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], atol=2e-5, rtol=1e-4)
    assert torch.isfinite(got).all()


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2"])
def test_unpadded_forward_matches_sdpa(kind):
    ours, ref = twin_models(kind)
    ids = torch.randint(3, VOCAB, (2, 23))
    with torch.no_grad():
        torch.testing.assert_close(ours(input_ids=ids).logits, ref(input_ids=ids).logits, atol=2e-5, rtol=1e-4)


def test_padding_mask_reaches_attention(monkeypatch):
    """Without the mask registration the padded rows would silently attend to pad tokens."""
    seen = []
    original = hf_flashpatch.api.flash_attn_varlen_func

    def spy(*args, **kwargs):
        seen.append(args[3].tolist())  # cu_seqlens_q
        return original(*args, **kwargs)

    monkeypatch.setattr(hf_flashpatch.api, "flash_attn_varlen_func", spy)
    model = tiny_model("llama")
    ids, mask = padded_batch([5, 3], 5)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    assert seen and seen[0] == [0, 5, 8]


def test_padding_changes_nothing_for_real_tokens():
    """A left-padded row gives the same logits as the same tokens alone (the pads are invisible)."""
    model = tiny_model("mistral")
    ids, mask = padded_batch([11, 6], 11)
    with torch.no_grad():
        batched = model(input_ids=ids, attention_mask=mask).logits
        alone = model(input_ids=ids[1:, -6:]).logits
    torch.testing.assert_close(batched[1, -6:], alone[0], atol=2e-5, rtol=1e-4)


def test_bf16_model_matches_sdpa():
    ours, ref = twin_models("llama", dtype=torch.bfloat16)
    ids, mask = padded_batch([13, 8], 13)
    with torch.no_grad():
        got = ours(input_ids=ids, attention_mask=mask).logits.float()
        want = ref(input_ids=ids, attention_mask=mask).logits.float()
        exact = ours.float()(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    ours_err = (got[real] - exact[real]).abs().max()
    ref_err = (want[real] - exact[real]).abs().max()
    assert ours_err <= 2 * ref_err + 1e-2, (ours_err, ref_err)


def test_mixed_dtypes_under_autocast():
    """fp32 weights under bf16 autocast: q/k may arrive fp32 while v is bf16; we cast to the autocast dtype."""
    module = torch.nn.Module()
    module.is_causal = True
    q = torch.randn(2, 4, 9, 16)
    k = torch.randn(2, 2, 9, 16)
    v = torch.randn(2, 2, 9, 16).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, weights = attention_forward(module, q, k, v, None, scaling=0.25)
    assert weights is None and out.dtype == torch.bfloat16 and out.shape == (2, 9, 4, 16) and out.is_contiguous()
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.bfloat16().float(), k.bfloat16().float(), v.float(), is_causal=True, scale=0.25, enable_gqa=True
    ).transpose(1, 2)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    # No autocast: mismatched dtypes meet in the half dtype that the projections produced.
    out, _ = attention_forward(module, q, k, v, None, scaling=0.25)
    assert out.dtype == torch.bfloat16


def test_model_under_autocast_matches_sdpa():
    ours, ref = twin_models("qwen2")
    ids, mask = padded_batch([10, 7], 10)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = ours(input_ids=ids, attention_mask=mask).logits.float()
        want = ref(input_ids=ids, attention_mask=mask).logits.float()
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], atol=5e-2, rtol=5e-2)


def test_softcap_is_applied():
    module = torch.nn.Module()
    q, k, v = torch.randn(1, 2, 5, 8) * 4, torch.randn(1, 2, 5, 8) * 4, torch.randn(1, 2, 5, 8)
    out, _ = attention_forward(module, q, k, v, None, scaling=1.0, softcap=2.0)
    scores = 2.0 * torch.tanh(q @ k.transpose(-1, -2) / 2.0)
    scores = scores.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
    ref = (scores.softmax(-1) @ v).transpose(1, 2)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_training_gradients_match_sdpa():
    ours, ref = twin_models("llama", attention_dropout=0.0)
    ours.train(), ref.train()
    ids, mask = padded_batch([12, 8], 12)
    for model in (ours, ref):
        model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss.backward()
    grad = lambda m: m.model.layers[0].self_attn.q_proj.weight.grad  # noqa: E731
    torch.testing.assert_close(grad(ours), grad(ref), atol=1e-5, rtol=1e-4)


def test_output_attentions_refused():
    model = tiny_model("llama")
    with pytest.raises(UnsupportedAttentionFeature, match="eager"):
        model(input_ids=torch.randint(3, VOCAB, (1, 5)), output_attentions=True)


def test_dropout_in_training_refused():
    model = tiny_model("llama", attention_dropout=0.1).train()
    with pytest.raises(UnsupportedAttentionFeature, match="dropout=0.1"):
        model(input_ids=torch.randint(3, VOCAB, (1, 5)))
    model.eval()  # inference passes dropout=0: fine
    model(input_ids=torch.randint(3, VOCAB, (1, 5)))


def test_sinks_without_an_eager_function_are_refused_by_name():
    """One sink logit per query head runs on the kernels (test_sinks.py); sinks of another shape take the
    model's own eager attention (see test_unsupported.py), and a module whose file has none gets an error
    naming the reason, never an answer that ignores the sinks."""
    q, k, v = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8)
    with pytest.raises(UnsupportedAttentionFeature, match=r"attention sinks"):
        attention_forward(torch.nn.Module(), q, k, v, None, s_aux=torch.zeros(4, 2))


def test_four_dimensional_mask_takes_the_torch_fallback(monkeypatch):
    """A 4-D mask the model built itself is honoured as given (transformers' sdpa with that mask)."""
    from hf_flashpatch.backend import unsupported

    monkeypatch.setattr(unsupported, "_warned", set())  # one warning per reason and process: this test's own
    q, k, v = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 2, True
    mask = torch.tensor([[True, False, True], [True, True, False], [False, True, True]])[None, None]  # (1, 1, 3, 3)
    with pytest.warns(UserWarning, match="4-D mask"):
        out, _ = attention_forward(module, q, k, v, mask)
    want = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                                            attn_mask=mask).transpose(1, 2)  # fmt: skip
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


def test_head_counts_come_from_shapes():
    """MQA tensors through a module whose attributes say nothing about heads."""
    q, k, v = torch.randn(2, 6, 7, 8), torch.randn(2, 1, 7, 8), torch.randn(2, 1, 7, 8)
    out, _ = attention_forward(torch.nn.Module(), q, k, v, None)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_unpad_plan_follows_in_place_mask_changes():
    """The per-mask plan is reused across layers, but never for a mask changed in place."""
    q, k, v = torch.randn(2, 4, 6, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[0, :2] = False
    first, _ = attention_forward(torch.nn.Module(), q, k, v, mask)
    mask[1, :3] = False  # in place: same object, new version
    second, _ = attention_forward(torch.nn.Module(), q, k, v, mask)
    fresh, _ = attention_forward(torch.nn.Module(), q, k, v, mask.clone())
    torch.testing.assert_close(second, fresh)
    assert not torch.allclose(first[1, 3:], second[1, 3:])
    assert (second[1, :3] == 0).all()  # padded query rows are zeros


def test_a_mask_of_another_batch_is_refused_by_name():
    """A batch-1 mask over a batch of 2 used to leave row 1's output all zeros without an error."""
    q, k, v = torch.randn(2, 4, 6, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    module = torch.nn.Module()
    for rows in (1, 3):
        mask = torch.ones(rows, 6, dtype=torch.bool)
        with pytest.raises(ValueError, match=rf"the attention mask has {rows} rows .* but the batch has 2"):
            attention_forward(module, q, k, v, mask)


def test_packed_tables_are_checked_before_a_cast():
    """int64 cu_seq_lens past int32 used to wrap to a valid-looking table in the backend's cast."""
    q, k, v = torch.randn(1, 4, 6, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    bad = torch.tensor([0, 3, 2**32 + 6])
    with pytest.raises(ValueError, match=r"cu_seqlens_q ends at 4294967302 but q has only 6 rows"):
        attention_forward(torch.nn.Module(), q, k, v, None, cu_seq_lens_q=bad, cu_seq_lens_k=bad, max_length_q=3,
                          max_length_k=3)  # fmt: skip
    good = torch.tensor([0, 3, 6])  # int64 tables work as they are
    out, _ = attention_forward(torch.nn.Module(), q, k, v, None, cu_seq_lens_q=good, cu_seq_lens_k=good,
                               max_length_q=3, max_length_k=3)  # fmt: skip
    for s in (slice(0, 3), slice(3, 6)):
        ref = torch.nn.functional.scaled_dot_product_attention(q[:, :, s], k[:, :, s], v[:, :, s], is_causal=True,
                                                               enable_gqa=True).transpose(1, 2)  # fmt: skip
        torch.testing.assert_close(out[:, s], ref, atol=1e-5, rtol=1e-5)
