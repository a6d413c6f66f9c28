"""Mask registration: which mask transformers builds for our attention name.

Our attention function consumes what transformers' flash_attention_2 integration consumes: ``None`` when
attention is plainly causal over all the keys it receives, else a 2-D ``(batch, seqlen)`` bool key-padding
mask (True = real token) covering the first ``seqlen`` keys. :func:`key_padding_mask` is
:func:`transformers.masking_utils.flash_attention_mask` plus one case that function leaves out: a
StaticCache without padding. The static buffer hands the attention all ``max_cache_len`` slots, of which
only ``q_offset + q_length - kv_offset`` are written so far; we return an all-True mask of that length so
that the unwritten slots are cut off (``None`` would let the queries attend to them).

A bidirectional mask (``create_bidirectional_mask``: encoders, and cross-attention, whose queries are the
decoder's tokens and whose keys are the encoder's) has no cache behind it, so no slot is unwritten: there a
query shorter than its keys is not a decode step, and the mask is transformers' own.

Without this registration transformers would pass ``None`` even for padded batches, and padding tokens
would silently be attended to. Packed sequences (``DataCollatorWithFlattening``) reach the attention
function as ``cu_seq_lens_*`` or ``position_ids``; their mask stays ``None``.
"""

from __future__ import annotations

import torch

from ..errors import UnsupportedModel
from .unpatchable import reads_4d_mask_reason


def key_padding_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset=0, attention_mask=None,
                     **kwargs):  # fmt: skip
    """``None`` or a ``(batch_size, S <= kv_length)`` bool mask; same arguments as transformers' mask functions.

    Under ``torch.compile`` no value may decide the result (transformers' ``flash_attention_mask`` asks
    ``attention_mask.all()``), so there it is :func:`traced_key_mask` instead. So it is, too, for a static
    cache (its layers report ``q_offset`` as a tensor): ``generate`` builds the mask of a compiled decode
    step outside the compiled region, and only a mask whose shape stays the same at every step lets that
    region run as one CUDA graph.
    """
    config = kwargs.get("config")
    reason = reads_4d_mask_reason(config)
    if reason is not None:  # from_pretrained(attn_implementation=...) reaches here without patch()'s check
        raise UnsupportedModel(f"hf_flashpatch cannot serve this model: {reason}; use attn_implementation='sdpa'")
    # transformers' bidirectional masks (encoders, cross-attention) pass this flag; its causal masks do not.
    bidirectional = "allow_is_bidirectional_skip" in kwargs
    if getattr(config, "attention_chunk_size", None) is not None or (
            not bidirectional and only_the_4d_mask_says_it(config, kwargs.get("mask_function"), kwargs)):
        # What lives only in the mask (chunked attention, an overlay, causality the modules do not state): hand
        # over transformers' own 4-D mask, which the attention function serves through its documented torch
        # fallback (one warning)
        from transformers.masking_utils import sdpa_mask

        return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                         kv_offset=kv_offset, attention_mask=attention_mask,
                         **(kwargs | {"allow_is_causal_skip": False}))  # None would mean "use is_causal": fmt: skip
    if torch.compiler.is_compiling() or not isinstance(q_offset, int):
        return traced_key_mask(batch_size, q_length, kv_length, q_offset, kv_offset, attention_mask,
                               kwargs.get("device"), bidirectional)  # fmt: skip
    from transformers.masking_utils import flash_attention_mask

    mask = flash_attention_mask(
        batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset, kv_offset=kv_offset,
        attention_mask=attention_mask, **kwargs,
    )  # fmt: skip
    if mask is None and not bidirectional:
        written = int(q_offset) + q_length - int(kv_offset)  # keys this layer holds after the update
        if 0 < written < kv_length:
            mask = torch.ones(batch_size, written, dtype=torch.bool, device=kwargs.get("device"))
    return mask


# Decoders whose self-attention modules say ``is_causal=False``: their causality lives only in the mask that
# create_causal_mask builds (transformers gives them no flash-attention support, or, PEGASUS-X, one that reads
# the same flag). A None or 2-D mask would let every position see the future.
CAUSAL_ONLY_IN_MASK = frozenset({"nllb-moe", "pegasus_x", "informer"})


def _or_mask_code():
    """The code object every closure ``transformers.masking_utils.or_masks`` returns shares (an identity test
    ``torch.compile`` traces, where a name's ``startswith`` breaks the graph)."""
    from transformers.masking_utils import causal_mask_function, or_masks

    return or_masks(causal_mask_function).__code__


_OR_MASK_CODE = _or_mask_code()


def only_the_4d_mask_says_it(config, mask_function, kwargs) -> bool:
    """Whether a causal mask carries what a None or 2-D key-padding mask cannot: an ``or_mask_function`` or block
    overlay (bidirectional attention over image tokens: Gemma 3, PaliGemma; both build ``or_masks``), an
    ``and_mask_function`` (transformers marks both custom functions with ``use_vmap``), or the causality of a
    model in :data:`CAUSAL_ONLY_IN_MASK`. Packed sequences (an ``and_masks`` of transformers' own, no
    ``use_vmap``) stay ours: the attention reads them off ``position_ids``. So do models built with
    ``use_bidirectional_attention`` (EmbeddingGemma): their overlay makes the whole mask bidirectional, which
    their modules state (``is_causal=False``, the window in ``sliding_window``)."""
    if getattr(config, "use_bidirectional_attention", None) in (True, "all") and getattr(
            config, "model_type", None) not in CAUSAL_ONLY_IN_MASK:  # ("vision", Gemma 4: image tokens only)
        return False
    if getattr(config, "model_type", None) in CAUSAL_ONLY_IN_MASK or kwargs.get("use_vmap"):
        return True
    return getattr(mask_function, "__code__", None) is _OR_MASK_CODE  # a closure of or_masks (block overlays)


def traced_key_mask(batch_size: int, q_length: int, kv_length: int, q_offset, kv_offset, attention_mask, device,
                    bidirectional: bool = False):  # fmt: skip
    """The compile-time form: decided by shapes alone, ``None`` or a ``(batch_size, kv_length)`` bool mask.

    ``None`` when there is neither a padding mask nor a static buffer with unwritten slots (both known
    from shapes; a ``bidirectional`` mask has no cache, so no unwritten slot); otherwise one column per key
    slot the attention receives, False for padding and for slots not written yet, so its shape stays the same
    at every decoding step of a static cache (no recompilation) and :mod:`.traced` reads each row's key range
    from it on the device.
    """
    static_tail = not bidirectional and (
        not isinstance(q_offset, int) or int(q_offset) + q_length - int(kv_offset) < kv_length
    )
    if attention_mask is None and not static_tail:
        return None
    slots = torch.arange(kv_length, device=device)  # (kv_length,)
    written = slots < (q_offset + q_length - kv_offset) if static_tail else slots >= 0  # (kv_length,): filled slots
    if attention_mask is None:
        return written.expand(batch_size, kv_length)
    # The last kv_length columns of a longer mask (sliding layers), or the whole of a shorter one padded
    # with False: index arithmetic rather than slicing, so no guard on the mask's (growing) length.
    columns = attention_mask.shape[1]
    excess = columns - kv_length  # a plain int on a static first step, symbolic once the length varies
    index = slots + (max(excess, 0) if isinstance(excess, int) else torch.sym_max(excess, 0))  # (kv_length,)
    mask = attention_mask.to(device=device, dtype=torch.bool).gather(
        1, index.clamp(max=columns - 1).expand(batch_size, kv_length)
    )  # (B, kv_length)
    return mask & written & (index < columns)


def register_mask(name: str) -> None:
    from transformers.masking_utils import AttentionMaskInterface

    AttentionMaskInterface.register(name, key_padding_mask)
