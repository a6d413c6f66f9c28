"""Packed sequences (``DataCollatorWithFlattening``): one batch row holding several sequences gives, for
each sequence, the logits and loss of that sequence alone, through our varlen path."""

import pytest
import torch
from test_backend import VOCAB, tiny_model
from transformers import DataCollatorWithFlattening

import hf_flashpatch.api

LENGTHS = [7, 3, 12, 1, 5]


def sequences(seed=5):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in LENGTHS]


def model_inputs(batch):
    return {k: v for k, v in batch.items() if k != "labels"}


@pytest.fixture
def varlen_calls(monkeypatch):
    calls = []
    original = hf_flashpatch.api.flash_attn_varlen_func

    def spy(*args, **kwargs):
        calls.append(args[3].tolist())  # cu_seqlens_q
        return original(*args, **kwargs)

    monkeypatch.setattr(hf_flashpatch.api, "flash_attn_varlen_func", spy)
    return calls


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2"])
@pytest.mark.parametrize("flash_kwargs", [True, False], ids=["cu_seq_lens", "position_ids_only"])
def test_packed_matches_unpacked(kind, flash_kwargs, varlen_calls):
    model = tiny_model(kind)
    seqs = sequences()
    collate = DataCollatorWithFlattening(return_flash_attn_kwargs=flash_kwargs)
    batch = collate([{"input_ids": s} for s in seqs])
    assert batch["input_ids"].shape == (1, sum(LENGTHS))
    with torch.no_grad():
        packed = model(**model_inputs(batch)).logits[0]  # (T, vocab)
        alone = [model(input_ids=torch.tensor([s])).logits[0] for s in seqs]
    torch.testing.assert_close(packed, torch.cat(alone), atol=2e-5, rtol=1e-4)
    starts = [0] + torch.tensor(LENGTHS).cumsum(0).tolist()
    assert varlen_calls and all(c == starts for c in varlen_calls)


def test_packed_loss_and_gradients_match_padded_batch():
    """Training on a packed row equals training on the same sequences padded into a batch."""
    model = tiny_model("llama")
    seqs = sequences(seed=6)
    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=True)([{"input_ids": s} for s in seqs])
    packed_loss = model(**batch).loss
    packed_loss.backward()
    packed_grad = model.model.layers[1].self_attn.k_proj.weight.grad.clone()
    model.zero_grad()

    longest = max(LENGTHS)
    ids = torch.zeros(len(seqs), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, s in enumerate(seqs):  # right padding, as a training collator would pad
        ids[row, : len(s)] = torch.tensor(s)
        mask[row, : len(s)] = 1
    labels = ids.masked_fill(mask == 0, -100)
    padded_loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    padded_loss.backward()
    padded_grad = model.model.layers[1].self_attn.k_proj.weight.grad
    torch.testing.assert_close(packed_loss, padded_loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed_grad, padded_grad, atol=1e-5, rtol=1e-4)


def test_single_sequence_row_is_not_treated_as_packed(varlen_calls):
    model = tiny_model("llama")
    ids = torch.randint(3, VOCAB, (1, 10))
    with torch.no_grad():
        model(input_ids=ids, position_ids=torch.arange(10)[None])
    assert varlen_calls == []


def test_position_facts_cost_one_host_sync_per_forward_not_per_layer(varlen_calls, monkeypatch):
    """Whether a row is packed (and where its sequences start) is read off the device once per position
    tensor: every layer receives the same tensor, and each read would stall the GPU. An in-place change
    of that tensor is seen."""
    from hf_flashpatch.backend import attention as backend_attention

    computed = []
    real = backend_attention.is_packed_row

    def counting(*args):
        computed.append(1)
        return real(*args)

    monkeypatch.setattr(backend_attention, "is_packed_row", counting)
    model = tiny_model("llama")
    layers = model.config.num_hidden_layers
    assert layers >= 2
    ids = torch.randint(3, VOCAB, (1, 12))
    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 1, 2]])
    with torch.no_grad():
        model(input_ids=ids, position_ids=positions)
    assert len(computed) == 1 and len(varlen_calls) == layers
    assert varlen_calls[0] == [0, 5, 9, 12]
    positions[0, 5:] = torch.arange(7) + 5  # now one sequence: in place, same tensor object
    with torch.no_grad():
        model(input_ids=ids, position_ids=positions)
    assert len(computed) == 2 and len(varlen_calls) == layers  # recomputed, and no longer packed
