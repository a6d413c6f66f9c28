"""Registering the backend with transformers, and switching a loaded model to it.

:func:`register` makes ``attn_implementation=<name>`` work in ``from_pretrained`` and
``model.set_attn_implementation``; :func:`patch` switches a loaded model in one line.
"""

from __future__ import annotations

import logging

import torch

from . import paged_kernel
from .attention import attention_forward
from .masks import register_mask
from .paged import continuous_batching_forward, paged_attention_forward
from .unpatchable import refuse_if_no_interface_attention, refuse_if_not_switched, refuse_if_reads_4d_mask

_log = logging.getLogger(__name__)
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
    """Register ``name`` (attention + mask) and the continuous-batching names with transformers. Idempotent."""
    check_name(name)
    if name in _registered:
        return
    from transformers import AttentionInterface

    AttentionInterface.register(name, attention_forward)
    AttentionInterface.register(f"paged|{name}", paged_attention_forward)
    register_mask(name)
    if not _paged_prefix_supported():
        # From 5.19 transformers strips "paged|" when it looks a name up, so continuous batching gets a name
        # of its own (the mask too: the model builds its mask under whatever name it runs).
        AttentionInterface.register(continuous_batching_name(name), continuous_batching_forward)
        register_mask(continuous_batching_name(name))
    allow_continuous_batching(name)
    _registered.add(name)


def _paged_prefix_supported() -> bool:
    """transformers < 5.19 calls ``paged|<name>`` for continuous batching; later versions strip the prefix."""
    from transformers import AttentionInterface

    return "paged|sdpa" in AttentionInterface._global_mapping


def continuous_batching_name(name: str) -> str:
    """The name a model runs under during continuous batching: ``paged|<name>`` before transformers 5.19,
    ``<name>-paged`` from 5.19 (:func:`hf_flashpatch.backend.paged.continuous_batching_forward`)."""
    return f"paged|{name}" if _paged_prefix_supported() else f"{name}-paged"


_cb_base: dict[str, str] = {}  # each of our names (plain or continuous-batching) -> the plain name


def allow_continuous_batching(name: str) -> None:
    """Let ``generate_batch`` run a model whose attention is ``name`` through our functions.

    transformers' ``ContinuousBatchingManager.switch_to_cb_friendly_attn`` knows only its own names: before
    5.19 it may swap an unknown name for ``flash_attention_2`` (when flash-attn is installed), from 5.19 it
    refuses it. We wrap it so that for our names it picks :func:`continuous_batching_name`, and leaves every
    other name to transformers. The original implementation is restored on ``manager.stop()`` as
    transformers does. From 5.19 we also let transformers use its block-table decode path for our
    continuous-batching name (:func:`_allow_block_table_decode`).
    """
    for alias in (name, f"paged|{name}", f"{name}-paged"):
        _cb_base[alias] = name
    try:
        from transformers.generation.continuous_batching.continuous_api import ContinuousBatchingManager
    except ImportError:  # no continuous batching in this transformers
        return
    _allow_block_table_decode()
    original = ContinuousBatchingManager.switch_to_cb_friendly_attn
    if getattr(original, "_hf_flashpatch_wrapped", False):
        return

    def switch_to_cb_friendly_attn(self, model, *args, **kwargs):
        current = model.config._attn_implementation
        base = _cb_base.get(current) if isinstance(current, str) else None
        if base is None:
            return original(self, model, *args, **kwargs)
        target = continuous_batching_name(base)
        if target != current:
            model.set_attn_implementation(target)
            self._original_attn_impl = current
        return None

    switch_to_cb_friendly_attn._hf_flashpatch_wrapped = True
    switch_to_cb_friendly_attn.__wrapped__ = original
    switch_to_cb_friendly_attn.__doc__ = original.__doc__
    ContinuousBatchingManager.switch_to_cb_friendly_attn = switch_to_cb_friendly_attn


def _allow_block_table_decode() -> None:
    """Keep transformers' decode fast path on for our continuous-batching name (transformers >= 5.19).

    transformers turns the path off (``max_blocks_per_request = 0``) unless the model runs flash-attn on
    CUDA, because only ``flash_attn_with_kvcache`` can serve it. Ours can
    (:func:`hf_flashpatch.backend.paged_kernel.block_table_attention`), so for our name we keep what the
    config asks for when every layer group keeps a block table (no sliding-window layers) and
    :func:`~hf_flashpatch.backend.paged_kernel.block_table_route_unavailable` sees no reason against it (no
    kernels here, or multi-head latent attention);
    otherwise we turn it off as transformers would. Other names go to transformers' check.
    """
    try:
        from transformers.generation.continuous_batching import initialization
    except ImportError:
        return
    original = getattr(initialization, "ensure_decode_fast_path_is_available", None)
    if original is None or getattr(original, "_hf_flashpatch_wrapped", False) or _paged_prefix_supported():
        return

    def ensure_decode_fast_path_is_available(config, cb_config, user_requested=False, *args, **kwargs):
        current = getattr(config, "_attn_implementation", None)
        base = _cb_base.get(current) if isinstance(current, str) else None
        if base is None or current != continuous_batching_name(base):
            return original(config, cb_config, user_requested, *args, **kwargs)
        if cb_config.max_blocks_per_request == 0:  # turned off by the caller
            return None
        try:
            groups = initialization.group_layers_by_attn_type(config)
            keeps_tables = all(initialization.ATTN_TYPE_TO_ALLOCATOR[g].supports_block_table for g in groups)
        except (AttributeError, KeyError):  # a transformers whose cache we do not know: its own verdict
            return original(config, cb_config, user_requested, *args, **kwargs)
        reason = None if keeps_tables else f"layer groups {sorted(groups)} do not all keep a block table"
        reason = reason or paged_kernel.block_table_route_unavailable(config)
        if reason is not None:
            if user_requested:
                _log.warning(
                    "max_blocks_per_request=%s asked for the decode fast path, but %s cannot serve it here (%s)",
                    cb_config.max_blocks_per_request, current, reason,
                )  # fmt: skip
            cb_config.max_blocks_per_request = 0
        return None

    ensure_decode_fast_path_is_available._hf_flashpatch_wrapped = True
    ensure_decode_fast_path_is_available.__wrapped__ = original
    initialization.ensure_decode_fast_path_is_available = ensure_decode_fast_path_is_available


def patch(model: torch.nn.Module, *, name: str = "hfpatch") -> torch.nn.Module:
    """Switch a loaded transformers model (and its sub-models) to our attention, in place; returns it.

    It registers ``name`` if needed and calls ``model.set_attn_implementation(name)``, so the weights,
    device and dtype are untouched and ``model.set_attn_implementation("sdpa")`` switches back. Padding,
    packed sequences, KV caches, sliding windows and continuous batching (``generate_batch``) all run
    through the hf_flashpatch API from then on. A model that no attention backend can serve (it has no
    attention, does not use transformers' ``AttentionInterface``, or reads the 4-D mask itself) raises
    :class:`~hf_flashpatch.errors.UnsupportedModel` naming why, and is left as it was.
    """
    if not hasattr(model, "set_attn_implementation"):
        raise TypeError(f"patch() needs a transformers PreTrainedModel, got {type(model).__name__}")
    refuse_if_reads_4d_mask(model)  # UnsupportedModel, before anything changes
    refuse_if_no_interface_attention(model)
    register(name)
    model.set_attn_implementation(name)
    refuse_if_not_switched(model, name)  # transformers left it as it was: say so
    return model
