"""Pure-torch reference implementations: the definition of correct. No fast path imports these."""

from .masks import normalize_window, visibility_mask
from .naive import attention_reference, varlen_attention_reference
from .online_softmax import SoftmaxState
from .paged import gather_pages, paged_decode_reference, slot_decode_reference
from .tiled import attention_tiled

__all__ = [
    "SoftmaxState",
    "attention_reference",
    "attention_tiled",
    "gather_pages",
    "normalize_window",
    "paged_decode_reference",
    "slot_decode_reference",
    "varlen_attention_reference",
    "visibility_mask",
]
