"""The transformers attention backend: attention function, mask registration, continuous batching.

``register()`` runs when ``hf_flashpatch`` is imported; after it, ``attn_implementation="hfpatch"`` works in
``from_pretrained`` and ``set_attn_implementation``, and ``patch(model)`` switches a loaded model.
Tensors handed to the public API use the project layout ``(batch, seqlen, heads, head_dim)``.
"""

from .attention import UnsupportedAttentionFeature, attention_forward
from .paged import paged_attention_forward
from .patch import check_name, patch, register

__all__ = [
    "UnsupportedAttentionFeature",
    "attention_forward",
    "check_name",
    "paged_attention_forward",
    "patch",
    "register",
]
