"""Calibration for the ``pca`` KV-head merge: what each layer's attention sees, as a second moment.

The merge (:mod:`hf_flashpatch.gqa_merge`) needs, per decoder layer, ``Σ = E[x̂ x̂ᵀ]`` where ``x`` is
the attention input (the output of the layer's ``input_layernorm``) and ``x̂ = [x, 1]`` (the 1 carries
the biases). :func:`attention_input_moments` runs the unconverted model once over calibration token
rows and accumulates it with forward hooks, in float64.

Calibration text (:func:`calibration_ids`) is real English from the project's offline corpus
(:mod:`hf_flashpatch.text_data`, read through ``datasets``): the *training* documents only, so the
held-out documents that ``scripts/gqa_quality.py`` and ``convert`` evaluate on stay unseen. A model
without a tokenizer can only be calibrated on random token ids (:func:`random_ids`): it converts, but
the statistics are not those of text, so the merge is worse; the report says which was used.
"""

from __future__ import annotations

import time

import torch
from torch import nn

DEFAULT_TOKENS = 16384
DEFAULT_SEQ_LEN = 512


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """Every decoder layer, in order: the modules with both ``self_attn`` and ``input_layernorm``."""
    layers = [m for m in model.modules() if hasattr(m, "self_attn") and hasattr(m, "input_layernorm")]
    if not layers:
        raise ValueError(f"{type(model).__name__}: no decoder layer with self_attn and input_layernorm")
    return layers


def attention_input_moments(model: nn.Module, ids: torch.Tensor, *, batch_size: int = 4,
                            progress: bool = True) -> list[torch.Tensor]:
    """Per layer ``E[x̂ x̂ᵀ]`` ``(hidden + 1, hidden + 1)`` float64 over every token of ``ids`` ``(B, S)``."""
    from tqdm.auto import tqdm

    layers = decoder_layers(model)
    hidden = model.config.hidden_size
    device = next(model.parameters()).device
    sums = [torch.zeros(hidden + 1, hidden + 1, dtype=torch.float64, device=device) for _ in layers]

    def hook(index):
        def accumulate(module, inputs, output):
            x = output.detach().reshape(-1, hidden).double()  # (B·S, hidden)
            x = torch.cat([x, x.new_ones(x.shape[0], 1)], dim=1)  # (B·S, hidden+1): x̂
            sums[index].addmm_(x.T, x)  # float64: Σ's small eigenvalues decide the value merge
        return accumulate

    handles = [layer.input_layernorm.register_forward_hook(hook(i)) for i, layer in enumerate(layers)]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in tqdm(range(0, ids.shape[0], batch_size), desc="calibrating", unit="batch",
                              disable=not progress):
                model(input_ids=ids[start:start + batch_size].to(device), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return [(s / ids.numel()).cpu() for s in sums]


def random_ids(vocab_size: int, *, tokens: int = DEFAULT_TOKENS, seq_len: int = DEFAULT_SEQ_LEN,
               seed: int = 0) -> torch.Tensor:
    """``(B, seq_len)`` uniform random token ids, seeded: the fallback for a model without a tokenizer."""
    rows = max(1, tokens // seq_len)
    return torch.randint(0, vocab_size, (rows, seq_len), generator=torch.Generator().manual_seed(seed))


def _text_ids(split: str, tokenizer, *, tokens: int, seq_len: int, source: str, cache_dir) -> tuple[torch.Tensor, str]:
    """``(B, seq_len)`` token ids from the first documents of ``split`` (``train`` or ``eval``) of the corpus."""
    from . import text_data

    documents = text_data.load_text_splits(None, cache_dir=cache_dir, source=source)[split]
    source_used = text_source_used(source, cache_dir)
    rows = max(1, tokens // seq_len)
    flat: list[int] = []
    for start in range(0, len(documents), 8):  # a few documents at a time: only as many as the budget needs
        batch = documents.select(range(start, min(start + 8, len(documents))))
        flat += [t for doc in text_data.tokenize_documents(batch, tokenizer)["input_ids"] for t in doc]
        if len(flat) >= rows * seq_len:
            break
    if len(flat) < seq_len:
        raise ValueError(f"the {split} text has {len(flat)} tokens, fewer than one row of {seq_len}")
    rows = min(rows, len(flat) // seq_len)
    ids = torch.tensor(flat[:rows * seq_len]).reshape(rows, seq_len)  # (B, S)
    return ids, f"{source_used} {'training' if split == 'train' else 'held-out'} documents ({rows} x {seq_len} tokens)"


def calibration_ids(tokenizer, *, tokens: int = DEFAULT_TOKENS, seq_len: int = DEFAULT_SEQ_LEN,
                    source: str = "auto", cache_dir=None) -> tuple[torch.Tensor, str]:
    """``((B, seq_len) token ids, description)`` from the training documents of the offline corpus.

    Documents are taken in order, tokenised, EOS-separated and cut into ``tokens // seq_len`` rows
    (at least one), as training packs them.
    """
    return _text_ids("train", tokenizer, tokens=tokens, seq_len=seq_len, source=source, cache_dir=cache_dir)


def heldout_ids(tokenizer, *, tokens: int = 4096, seq_len: int = DEFAULT_SEQ_LEN, source: str = "auto",
                cache_dir=None) -> tuple[torch.Tensor, str]:
    """The same from the held-out documents (every 10th): what ``convert`` measures perplexity on."""
    return _text_ids("eval", tokenizer, tokens=tokens, seq_len=seq_len, source=source, cache_dir=cache_dir)


def usable_tokenizer(tokenizer) -> bool:
    """Whether ``tokenizer`` turns English into tokens (transformers 5 builds an empty Qwen2 tokenizer
    for a checkpoint folder that has no tokenizer files; it encodes every text to nothing)."""
    return tokenizer is not None and tokenizer.eos_token_id is not None and \
        len(tokenizer("The attention heads of a group.", add_special_tokens=False)["input_ids"]) > 0


def text_source_used(source: str = "auto", cache_dir=None) -> str:
    """The corpus :func:`calibration_ids` / :func:`heldout_ids` read for ``source`` (``auto`` -> ``wiki`` or ``pydoc``)."""
    from . import text_data

    return text_data.cached_source(text_data.corpus_folder(cache_dir, source)) or source


def calibrate(model: nn.Module, *, tokenizer=None, ids: torch.Tensor | None = None, tokens: int = DEFAULT_TOKENS,
              seq_len: int = DEFAULT_SEQ_LEN, seed: int = 0, source: str = "auto", cache_dir=None,
              progress: bool = True) -> tuple[list[torch.Tensor], dict]:
    """``(moments, details)``: second moments from ``ids`` if given, else text via ``tokenizer``, else random ids.

    Text is the training split of the corpus ``source`` (``text_data.SOURCES``) cached under
    ``cache_dir``. Rows are at most ``max_position_embeddings`` long. Random ids (no usable tokenizer)
    are capped at ``8 x (hidden + 1)`` tokens, enough for a full-rank ``Σ``: they carry no text
    statistics that more of them would sharpen. ``details`` records what was used (for
    ``gqa_conversion.json``): ``source`` is the corpus, ``caller`` or ``random``.
    """
    started = time.perf_counter()
    seq_len = min(seq_len, getattr(model.config, "max_position_embeddings", None) or seq_len)
    if ids is not None:
        description, used = "token ids given by the caller", "caller"
    elif usable_tokenizer(tokenizer):
        ids, description = calibration_ids(tokenizer, tokens=tokens, seq_len=seq_len, source=source,
                                           cache_dir=cache_dir)
        used = text_source_used(source, cache_dir)
    else:
        tokens = min(tokens, 8 * (model.config.hidden_size + 1))
        ids = random_ids(model.config.vocab_size, tokens=tokens, seq_len=seq_len, seed=seed)
        description, used = f"uniform random token ids, seed {seed} (no usable tokenizer: not text statistics)", "random"
    moments = attention_input_moments(model, ids, progress=progress)
    details = {"source": used, "data": description, "tokens": int(ids.numel()), "sequences": int(ids.shape[0]),
               "seq_len": int(ids.shape[1]), "seconds": round(time.perf_counter() - started, 1)}
    return moments, details
