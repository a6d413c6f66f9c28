"""patch()'s check that a model has attention an attention backend can serve (transformers itself lets a model with
no attention layer switch its implementation, so a patch would change nothing)."""

import sys
import types

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hf_flashpatch
from hf_flashpatch.backend.unpatchable import refuse_if_no_interface_attention
from hf_flashpatch.errors import UnsupportedModel


class _NoAttention(torch.nn.Module):  # this file's source never dispatches attention
    def __init__(self):
        super().__init__()
        self.mix = torch.nn.Linear(4, 4)


def test_modules_without_interface_attention_are_refused():
    with pytest.raises(UnsupportedModel, match="_NoAttention has no attention layer"):
        refuse_if_no_interface_attention(_NoAttention())


def test_a_llama_passes():
    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    model = LlamaForCausalLM(config)
    refuse_if_no_interface_attention(model)  # its attention module's file dispatches through the interface
    assert hf_flashpatch.patch(model).config._attn_implementation == "hfpatch"


def test_unreadable_source_decides_nothing(monkeypatch):
    """A class defined where no source can be read (a notebook cell): the check steps aside, and transformers'
    own refusal (refuse_if_not_switched) still applies."""
    monkeypatch.setitem(sys.modules, "notebook_cell_7", types.ModuleType("notebook_cell_7"))
    cell_class = type("CellModel", (torch.nn.Module,), {"__module__": "notebook_cell_7"})
    refuse_if_no_interface_attention(cell_class())  # no exception
