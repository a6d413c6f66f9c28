"""Skip a test unless the real SmolLM2-135M (the shipped GGUF) and what reading it needs are installed."""

import pytest


def require_smollm2(*modules: str) -> None:
    """Skip unless ``gguf`` (and each of ``modules``) imports and the SmolLM2 GGUF file is found."""
    for name in ("gguf", *modules):
        pytest.importorskip(name)
    from hf_flashpatch.models import smollm2_dir

    try:
        smollm2_dir()
    except FileNotFoundError as missing:
        pytest.skip(str(missing))
