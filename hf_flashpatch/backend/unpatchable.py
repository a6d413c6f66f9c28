"""Models that no hf_flashpatch attention name can serve, and why (``patch()`` refuses them by name).

Two kinds, both found by the coverage matrix (tests/test_architectures.py, which checks this table
against transformers' own models):

- models whose attention does not go through transformers' ``AttentionInterface`` (Bloom, MPT, ...),
  or that have no attention at all (Mamba, FalconMamba, ...): a patch would silently change nothing.
  ``set_attn_implementation`` keeps ``sdpa``/``eager`` for the first with only a log line, and switches
  the second (its check looks for an ``*Attention*`` class and assumes a model without one delegates to
  sub-models), so ``patch()`` looks at the modeling code of the model's own modules first;
- models whose modeling code reads the 4-D sdpa/eager mask itself, before any attention call: our
  registered mask is ``None`` or a 2-D key-padding mask (:mod:`.masks`), on which they fail with an
  ``IndexError`` deep in their own code (transformers gives them no flash-attention support either, for
  the same reason). ``from_pretrained(..., attn_implementation="hfpatch")`` reaches our mask function,
  which raises the same error for them.

Both keep working with ``attn_implementation="sdpa"``.
"""

from __future__ import annotations

import inspect
import sys

from ..errors import UnsupportedModel

# What a modeling file that dispatches attention through transformers' AttentionInterface names.
_INTERFACE_MARK = "ALL_ATTENTION_FUNCTIONS"

# model_type -> what the model reads from the 4-D mask
READS_4D_MASK = {
    "bigbird_pegasus": "its encoder adds the mask to its scores",
    "doge": "dynamic mask",
    "git": "image-text attention",
    "deepseek_v4": "compressed-attention block bias",
    **dict.fromkeys(("axk2", "deepseek_v32", "dots3_note_text", "glm_moe_dsa", "hy_v4", "kolibri1_1",
                     "qwen4_exp_text"), "sparse-attention indexer"),
}  # fmt: skip


def reads_4d_mask_reason(config) -> str | None:
    """Why a model with this config cannot take our 2-D mask, or None."""
    model_type = getattr(config, "model_type", None)
    if model_type not in READS_4D_MASK:
        return None
    return (f"its modeling code ({model_type}) reads the 4-D sdpa/eager mask itself ({READS_4D_MASK[model_type]}); "
            "hf_flashpatch's 2-D key-padding mask cannot serve it")  # fmt: skip


def refuse_if_reads_4d_mask(model) -> None:
    """Raise :class:`UnsupportedModel` for a model (or sub-model config) that reads the 4-D mask itself."""
    configs = [model.config] + [getattr(model.config, name) for name in getattr(model.config, "sub_configs", {})]
    for config in configs:
        reason = reads_4d_mask_reason(config)
        if reason is not None:
            raise UnsupportedModel(f"hf_flashpatch cannot patch this model: {type(model).__name__}: {reason}; "
                                   "use attn_implementation='sdpa'")  # fmt: skip


def refuse_if_not_switched(model, name: str) -> None:
    """After ``set_attn_implementation(name)``: raise if transformers kept another implementation (a model
    whose attention does not go through ``AttentionInterface``; transformers only logs it)."""
    current = getattr(model.config, "_attn_implementation", None)
    if current != name:
        raise UnsupportedModel(
            f"hf_flashpatch cannot patch this model: {type(model).__name__} does not route its attention through "
            f"transformers' AttentionInterface, so no attention backend can serve it (transformers kept "
            f"{current!r}); use attn_implementation='sdpa'"
        )


def _module_source(module_name: str) -> str | None:
    module = sys.modules.get(module_name)
    try:
        return inspect.getsource(module) if module is not None else None
    except (OSError, TypeError):  # a class defined in a notebook or a REPL
        return None


def refuse_if_no_interface_attention(model) -> None:
    """Raise :class:`UnsupportedModel` when no module of the model is defined in code that calls attention through
    ``AttentionInterface`` (a state-space model, or attention of its own). Where some module's source cannot be
    read, nothing is decided here and :func:`refuse_if_not_switched` still applies."""
    module_names = {type(module).__module__ for module in model.modules()}
    for module_name in module_names:
        source = _module_source(module_name)
        if source is None or _INTERFACE_MARK in source:
            return
    raise UnsupportedModel(
        f"hf_flashpatch cannot patch this model: {type(model).__name__} has no attention layer that goes through "
        "transformers' AttentionInterface (no attention at all, or attention code of its own), so an attention "
        "backend would change nothing; keep attn_implementation='sdpa' or its default"
    )
