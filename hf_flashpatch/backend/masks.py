"""Mask registration: which mask transformers builds for our attention name.

Our attention function consumes what transformers' flash_attention_2 integration consumes, so we register
:func:`transformers.masking_utils.flash_attention_mask` under our name: ``None`` when attention is plainly
causal (no padding), else the 2-D ``(batch, seqlen)`` bool key-padding mask (True = real token), sliced to
the layer's key length (sliding layers, StaticCache). Without this registration transformers would pass
``None`` even for padded batches, and padding tokens would silently be attended to.

Packed sequences (``DataCollatorWithFlattening``) reach the attention function as ``cu_seq_lens_*`` or
``position_ids``; the mask stays ``None`` for them.
"""

from __future__ import annotations


def register_mask(name: str) -> None:
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionMaskInterface.register(name, flash_attention_mask)
