"""Attention that lives only in transformers' 4-D mask reaches the backend as that mask (its torch fallback).

Found by the 2026-12-05 review, all giving wrong logits without a word before:

- decoders whose self-attention modules say ``is_causal=False`` (NLLB-MoE, PEGASUS-X, Informer): causality is
  in ``create_causal_mask`` alone, and a None mask let every decoder position see the future;
- a causal mask with an overlay (Gemma 3's and PaliGemma's bidirectional image tokens, ``token_type_ids``);
- BigBird-Pegasus, whose encoder adds the mask to its scores itself: refused by name.

Models that state their bidirectionality in their modules (``use_bidirectional_attention``) keep the kernels.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoConfig, AutoModelForImageTextToText, AutoModelForSeq2SeqLM

import hf_flashpatch
from hf_flashpatch.backend import masks, unsupported
from hf_flashpatch.errors import UnsupportedModel

SEQ2SEQ = dict(vocab_size=100, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64,
               dropout=0.0, attention_dropout=0.0, pad_token_id=1, bos_token_id=0, eos_token_id=2,
               decoder_start_token_id=2)  # fmt: skip
EXTRA = {"nllb-moe": dict(num_experts=4, expert_capacity=8), "pegasus_x": dict(num_global_tokens=4, block_size=4)}


def _twins(config, auto, reference_attention="eager"):
    torch.manual_seed(0)
    ref = auto.from_config(copy.deepcopy(config), attn_implementation=reference_attention).eval()
    ours = auto.from_config(copy.deepcopy(config), attn_implementation=reference_attention).eval()
    ours.load_state_dict(ref.state_dict())
    hf_flashpatch.patch(ours)
    return ref, ours


@pytest.mark.parametrize("model_type", ["nllb-moe", "pegasus_x"])
def test_a_decoder_causal_only_in_its_mask_stays_causal(model_type, monkeypatch):
    config = AutoConfig.for_model(model_type, **SEQ2SEQ, **EXTRA[model_type])
    ref, ours = _twins(config, AutoModelForSeq2SeqLM)
    assert not ours.model.decoder.layers[0].self_attn.is_causal  # what made the None mask wrong
    generator = torch.Generator().manual_seed(1)
    ids, decoder_ids = torch.randint(4, 100, (2, 10), generator=generator), torch.randint(4, 100, (2, 5), generator=generator)
    monkeypatch.setattr(unsupported, "_warned", set())
    with torch.no_grad(), pytest.warns(UserWarning, match="4-D mask"):  # the documented fallback, said once
        got = ours(input_ids=ids, decoder_input_ids=decoder_ids).logits
    with torch.no_grad():
        want = ref(input_ids=ids, decoder_input_ids=decoder_ids).logits
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)  # was 0.015-0.025 apart


def test_bigbird_pegasus_is_refused_by_name():
    config = AutoConfig.for_model("bigbird_pegasus", **SEQ2SEQ, attention_type="original_full")
    model = AutoModelForSeq2SeqLM.from_config(config, attn_implementation="eager")
    with pytest.raises(UnsupportedModel, match=r"bigbird_pegasus\) reads the 4-D sdpa/eager mask itself"):
        hf_flashpatch.patch(model)


def _gemma3_with_images():
    vocab = 64
    text = dict(vocab_size=vocab + 8, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, sliding_window=64,
                layer_types=["sliding_attention", "full_attention"], pad_token_id=0)  # fmt: skip
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=32,
                  patch_size=8)  # fmt: skip
    config = AutoConfig.for_model("gemma3", text_config=text, vision_config=vision, mm_tokens_per_image=4,
                                  image_token_index=vocab + 1, boi_token_index=vocab + 2, eoi_token_index=vocab + 3,
                                  pad_token_id=0)  # fmt: skip
    generator = torch.Generator().manual_seed(1)
    words = torch.randint(3, vocab, (2, 6), generator=generator)
    ids = torch.cat([words[:, :3], torch.full((2, 1), config.boi_token_index),
                     torch.full((2, 4), config.image_token_index), torch.full((2, 1), config.eoi_token_index),
                     words[:, 3:]], 1)  # fmt: skip
    inputs = dict(input_ids=ids, pixel_values=torch.randn(2, 3, 32, 32, generator=generator),
                  attention_mask=torch.ones_like(ids), token_type_ids=(ids == config.image_token_index).long())
    return config, inputs


def test_image_tokens_keep_their_bidirectional_attention():
    config, inputs = _gemma3_with_images()
    ref, ours = _twins(config, AutoModelForImageTextToText, reference_attention="sdpa")
    with torch.no_grad():
        torch.testing.assert_close(ours(**inputs).logits, ref(**inputs).logits, atol=2e-5, rtol=1e-5)  # was 0.076


def test_which_causal_masks_go_four_dimensional():
    from transformers.masking_utils import and_masks, causal_mask_function, or_masks

    common = dict(batch_size=2, q_length=5, kv_length=5, attention_mask=None, device="cpu", dtype=torch.float32)
    llama = AutoConfig.for_model("llama")
    assert masks.key_padding_mask(**common, config=llama, mask_function=causal_mask_function) is None
    overlay = or_masks(causal_mask_function, lambda b, h, q, k: k == 0)
    four_d = masks.key_padding_mask(**common, config=llama, mask_function=overlay, use_vmap=True)
    assert four_d.shape == (2, 1, 5, 5) and bool(four_d[0, 0, 1, 0]) and not bool(four_d[0, 0, 1, 2])
    packed = and_masks(causal_mask_function, lambda b, h, q, k: True)  # transformers' own packing: no use_vmap
    assert masks.key_padding_mask(**common, config=llama, mask_function=packed) is None
    embedding_gemma = AutoConfig.for_model("gemma3_text", use_bidirectional_attention=True)
    assert masks.key_padding_mask(**common, config=embedding_gemma, mask_function=overlay, use_vmap=True) is None
    vision_only = AutoConfig.for_model("gemma4_text", use_bidirectional_attention="vision")  # image tokens only
    assert masks.key_padding_mask(**common, config=vision_only, mask_function=overlay).shape == (2, 1, 5, 5)
    nllb = AutoConfig.for_model("nllb-moe")
    causal = masks.key_padding_mask(**common, config=nllb, mask_function=causal_mask_function,
                                    allow_is_causal_skip=True)  # fmt: skip
    assert causal.shape == (2, 1, 5, 5) and torch.equal(causal[0, 0], torch.ones(5, 5, dtype=torch.bool).tril())
