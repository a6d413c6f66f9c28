"""Registering the backend with transformers, and switching a loaded model to it.

:func:`register` makes ``attn_implementation=<name>`` work in ``from_pretrained`` and
``model.set_attn_implementation``; :func:`patch` switches a loaded model in one line.
"""

from __future__ import annotations

import torch

from .attention import attention_forward
from .masks import register_mask
from .paged import paged_attention_forward

_registered: set[str] = set()


def check_name(name: str) -> None:
    """transformers gives names containing these a special meaning (e.g. it looks for the flash-attn package)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"the attention name must be a non-empty string, got {name!r}")
    for reserved in ("flash", "sdpa", "flex_attention", "/", "|"):
        if reserved in name:
            raise ValueError(
                f"the attention name must not contain {reserved!r} (transformers treats it specially), got {name!r}"
            )


def register(name: str = "hfpatch") -> None:
    """Register ``name`` (attention + mask) and ``paged|name`` with transformers. Idempotent."""
    check_name(name)
    if name in _registered:
        return
    from transformers import AttentionInterface

    AttentionInterface.register(name, attention_forward)
    AttentionInterface.register(f"paged|{name}", paged_attention_forward)
    register_mask(name)
    allow_continuous_batching(name)
    _registered.add(name)


def _paged_prefix_supported() -> bool:
    """transformers < 5.23 calls ``paged|<name>`` for continuous batching; later versions call ``<name>``."""
    from transformers import AttentionInterface

    return "paged|sdpa" in AttentionInterface._global_mapping


_cb_names: set[str] = set()


def allow_continuous_batching(name: str) -> None:
    """Let ``generate_batch`` run a model whose attention is ``name`` through our functions.

    transformers' ``ContinuousBatchingManager.switch_to_cb_friendly_attn`` knows only its own names: before
    5.23 it may swap an unknown name for ``flash_attention_2`` (when flash-attn is installed), from 5.23 it
    refuses it. We wrap it so that for our names it picks ``paged|<name>`` (before 5.23) or keeps ``<name>``
    (5.23+, where our attention function serves the packed batch), and leaves every other name to
    transformers. The original implementation is restored on ``manager.stop()`` as transformers does.
    """
    _cb_names.add(name)
    try:
        from transformers.generation.continuous_batching.continuous_api import ContinuousBatchingManager
    except ImportError:  # no continuous batching in this transformers
        return
    original = ContinuousBatchingManager.switch_to_cb_friendly_attn
    if getattr(original, "_hf_flashpatch_wrapped", False):
        return

    def switch_to_cb_friendly_attn(self, model, *args, **kwargs):
        current = model.config._attn_implementation
        base = current.removeprefix("paged|") if isinstance(current, str) else current
        if base not in _cb_names:
            return original(self, model, *args, **kwargs)
        target = f"paged|{base}" if _paged_prefix_supported() else base
        if target != current:
            model.set_attn_implementation(target)
            self._original_attn_impl = current
        return None

    switch_to_cb_friendly_attn._hf_flashpatch_wrapped = True
    switch_to_cb_friendly_attn.__wrapped__ = original
    switch_to_cb_friendly_attn.__doc__ = original.__doc__
    ContinuousBatchingManager.switch_to_cb_friendly_attn = switch_to_cb_friendly_attn


def patch(model: torch.nn.Module, *, name: str = "hfpatch") -> torch.nn.Module:
    """Switch a loaded transformers model (and its sub-models) to our attention, in place; returns it.

    It registers ``name`` if needed and calls ``model.set_attn_implementation(name)``, so the weights,
    device and dtype are untouched and ``model.set_attn_implementation("sdpa")`` switches back. Padding,
    packed sequences, KV caches, sliding windows and continuous batching (``generate_batch``) all run
    through the hf_flashpatch API from then on.
    """
    if not hasattr(model, "set_attn_implementation"):
        raise TypeError(f"patch() needs a transformers PreTrainedModel, got {type(model).__name__}")
    register(name)
    model.set_attn_implementation(name)
    return model
