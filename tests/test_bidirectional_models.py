"""Models whose attention is not causal, patched vs ``sdpa``: encoder-decoder cross-attention (BART, T5) and
bidirectional sliding windows (ModernBERT, Gemma 3 with bidirectional attention), which the coverage matrix of
causal LMs (``tests/test_architectures.py``) does not build. Tiny random fp32 models on the CPU; padded
encoders both ways. Found by the 2026-12-04 review: cross-attention had its encoder keys cut to the decoder's
length, and a bidirectional window saw only its left side."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

import hf_flashpatch
from hf_flashpatch.backend.masks import key_padding_mask, traced_key_mask

SEQ2SEQ = dict(vocab_size=100, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64,
               dropout=0.0, attention_dropout=0.0, pad_token_id=1, bos_token_id=0, eos_token_id=2,
               decoder_start_token_id=2, forced_bos_token_id=None, forced_eos_token_id=None, init_std=0.5)  # fmt: skip


def _config(model_type: str):
    if model_type == "t5":
        return AutoConfig.for_model("t5", vocab_size=100, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                                    num_decoder_layers=2, num_heads=4, dropout_rate=0.0, decoder_start_token_id=0)  # fmt: skip
    if model_type == "modernbert":  # a 4-token local window (sliding_window 2 each side), shorter than the inputs
        return AutoConfig.for_model("modernbert", vocab_size=100, hidden_size=64, num_hidden_layers=3,
                                    num_attention_heads=4, intermediate_size=128, max_position_embeddings=64,
                                    pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2,
                                    local_attention=4, global_attn_every_n_layers=3, attention_dropout=0.0)  # fmt: skip
    if model_type == "gemma3_text":
        return AutoConfig.for_model("gemma3_text", vocab_size=100, hidden_size=64, intermediate_size=128,
                                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                    sliding_window=4, layer_types=["sliding_attention", "full_attention"],
                                    use_bidirectional_attention=True, pad_token_id=0)  # fmt: skip
    return AutoConfig.for_model(model_type, **SEQ2SEQ)


def _twins(model_type: str, model_class):
    config = _config(model_type)
    torch.manual_seed(0)
    ref = model_class.from_config(copy.deepcopy(config), attn_implementation="sdpa").eval()
    ours = model_class.from_config(copy.deepcopy(config), attn_implementation="sdpa").eval()
    ours.load_state_dict(ref.state_dict())
    hf_flashpatch.patch(ours)
    return ref, ours


def _masks(batch=3, length=10):
    right, left = torch.ones(batch, length, dtype=torch.long), torch.ones(batch, length, dtype=torch.long)
    right[1, 6:], right[2, 3:] = 0, 0
    left[1, :4], left[2, :7] = 0, 0
    return {"no padding": None, "right padding": right, "left padding": left}


@pytest.mark.parametrize("model_type", ["bart", "t5"])
@pytest.mark.parametrize("padding", ["no padding", "right padding", "left padding"])
def test_cross_attention_sees_every_encoder_key(model_type, padding):
    ref, ours = _twins(model_type, AutoModelForSeq2SeqLM)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(4, 100, (3, 10), generator=generator)
    decoder_ids = torch.randint(4, 100, (3, 5), generator=generator)  # fewer decoder tokens than encoder keys
    inputs = dict(input_ids=ids, decoder_input_ids=decoder_ids, attention_mask=_masks()[padding])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # T5's position bias takes the documented fallback, with its warning
        expected, got = ref(**inputs).logits, ours(**inputs).logits
    torch.testing.assert_close(got, expected, atol=3e-4, rtol=1e-4)


@pytest.mark.parametrize("cache", [None, "static"])
def test_encoder_decoder_generate_matches_sdpa(cache):
    ref, ours = _twins("bart", AutoModelForSeq2SeqLM)
    ids = torch.randint(4, 100, (2, 10), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    extra = {} if cache is None else dict(cache_implementation=cache)
    with torch.no_grad():
        expected = ref.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, **extra)
        got = ours.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, **extra)
    assert torch.equal(got, expected)


def test_compiled_cross_attention_with_a_padded_encoder():
    """The traced path (torch.compile) takes the same rule: every decoder query row, the encoder's keys."""
    ref, ours = _twins("bart", AutoModelForSeq2SeqLM)
    generator = torch.Generator().manual_seed(2)
    ids = torch.randint(4, 100, (3, 10), generator=generator)
    decoder_ids = torch.randint(4, 100, (3, 5), generator=generator)
    mask = _masks()["right padding"]
    inputs = dict(input_ids=ids, decoder_input_ids=decoder_ids, attention_mask=mask, use_cache=False)
    torch._dynamo.reset()
    compiled = torch.compile(ours, backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(**inputs).logits, ref(**inputs).logits, atol=3e-4, rtol=1e-4)


@pytest.mark.parametrize("model_type", ["modernbert", "gemma3_text"])
@pytest.mark.parametrize("padding", ["no padding", "right padding", "left padding"])
def test_bidirectional_sliding_window_sees_both_sides(model_type, padding):
    ref, ours = _twins(model_type, AutoModel)
    ids = torch.randint(4, 100, (3, 10), generator=torch.Generator().manual_seed(3))
    mask = _masks()[padding]
    with torch.no_grad():
        expected = ref(input_ids=ids, attention_mask=mask).last_hidden_state
        got = ours(input_ids=ids, attention_mask=mask).last_hidden_state
    real = torch.ones(3, 10, dtype=torch.bool) if mask is None else mask.bool()
    torch.testing.assert_close(got[real], expected[real], atol=3e-4, rtol=1e-4)


def test_bidirectional_masks_have_no_unwritten_slots():
    """A query shorter than its keys is a decode step only for a causal mask; a bidirectional one (cross-attention)
    keeps every key."""
    common = dict(batch_size=2, q_length=5, kv_length=10, q_offset=0, kv_offset=0, attention_mask=None, device="cpu")
    assert key_padding_mask(**common, allow_is_bidirectional_skip=True) is None
    causal = key_padding_mask(**common)
    assert causal is not None and causal.shape == (2, 5)  # the unwritten tail of a cache, cut off
    assert traced_key_mask(2, 5, 10, 0, 0, None, "cpu", bidirectional=True) is None
    padded = torch.tensor([[1] * 10, [1] * 6 + [0] * 4])
    mask = traced_key_mask(2, 5, 10, 0, 0, padded, "cpu", bidirectional=True)
    assert torch.equal(mask, padded.bool())
