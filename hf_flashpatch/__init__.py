"""hf_flashpatch: FlashAttention-style CUDA kernels (JIT-compiled by PyCUDA) as a one-line attention
backend for Hugging Face transformers, with a pure-torch reference that serves CPU machines.

Layout everywhere: ``(batch, seqlen, heads, head_dim)``; K/V may have fewer heads (GQA/MQA).

    import hf_flashpatch
    hf_flashpatch.patch(model)                        # or:
    AutoModelForCausalLM.from_pretrained(path, attn_implementation=hf_flashpatch.ATTN_NAME)
"""

from .api import (
    flash_attn_func,
    flash_attn_paged_decode,
    flash_attn_slot_varlen_func,
    flash_attn_varlen_func,
    flash_attn_with_kvcache,
    kv_append,
)
from .checkpoint_conversion import ConversionError
from .errors import KernelUnsupported, PagePoolExhausted, UnsupportedModel

# The name registered with transformers. It must not contain "flash", "sdpa", "flex_attention" or
# "/": transformers treats such names specially (e.g. it looks for the flash-attn package).
ATTN_NAME = "hfpatch"

__version__ = "0.1.0"

__all__ = [
    "ATTN_NAME",
    "ConversionError",
    "KernelUnsupported",
    "PagePoolExhausted",
    "UnsupportedModel",
    "flash_attn_func",
    "flash_attn_paged_decode",
    "flash_attn_slot_varlen_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "kv_append",
    "patch",
]


def patch(model, *, name: str = ATTN_NAME):
    """Switch a loaded transformers model to the hf_flashpatch backend in place; returns the model."""
    from .backend import patch as _patch

    return _patch(model, name=name)


def _register_backend() -> None:
    try:
        from .backend import register
    except ImportError:  # backend not importable (e.g. transformers too old): API still works
        return
    register()


_register_backend()
