"""Convert a multi-head (or GQA) attention checkpoint to fewer KV heads: GQA or MQA.

Ainslie et al. 2023, "GQA: Training Generalized Multi-Query Transformer Models from Multi-Head
Checkpoints": the K and V projection heads of each group are pooled into one head, then the model is
briefly uptrained (``scripts/uptrain.py``). Groups are *consecutive* heads, the grouping transformers'
``repeat_kv`` uses: query head ``h`` reads KV head ``h // (H / H_kv)``, so new KV head ``j`` replaces
old KV heads ``j*g .. j*g + g - 1`` with ``g = H_kv_old / H_kv_new``.

Methods:

- ``pca`` (default): merges each group up to the changes of basis that leave the model unchanged
  (a complex factor per RoPE pair on keys, folded into the queries; an invertible map on values,
  folded into ``o_proj``), chosen from the second moment of each layer's attention input over a
  calibration set (:mod:`hf_flashpatch.gqa_merge`, :mod:`hf_flashpatch.gqa_calibration`). On
  SmolLM2-135M 3 -> 1 KV heads its held-out perplexity is ~160x lower than ``mean``'s
  (``docs/gqa_uptraining.md``).

The paper's three (its Figure 6 compares them):

- ``mean``: each new head's K/V weights (and biases) are the mean of its group's.
- ``first``: each new head keeps the first head of its group.
- ``random``: the K/V projections are re-initialised from scratch (normal, std
  ``config.initializer_range``, zero biases), seeded by ``seed``.

Architectures: Llama, Mistral, Qwen2 (K/V biases are pooled like the weights) and Qwen3. Qwen3
normalises each key head with an RMSNorm (``k_norm``) *after* ``k_proj``; its weight has shape
``(head_dim,)`` and is shared by all heads, so it stays as it is. Pooling acts on the pre-norm
projection, so a pooled key is ``k_norm(mean_i W_i x)``: the RMSNorm restores the scale that
averaging shrinks (keys pointing different ways average to a shorter vector) instead of
``mean_i k_norm(W_i x)``. Both agree when the heads of a group are equal, which is what makes the
exactness checks hold. ``q_norm`` and the query heads are not touched. (``pca`` on Qwen3 mean-pools the
keys the same way, since the shared norms break the exact key maps, and merges the values exactly.)

The converted model keeps the plain transformers classes, so ``save_pretrained`` writes a checkpoint
that ``from_pretrained`` loads with no custom code.

    model = convert_to_gqa("path/to/mha", 1)                      # MQA, pca merge (calibrates first)
    hf-flashpatch convert path/to/mha path/to/mqa --kv-heads 1   # folder to folder, from the shell

Folder to folder (checks, the atomic write, the report file and the command):
:mod:`hf_flashpatch.checkpoint_conversion`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from .gqa_calibration import DEFAULT_TOKENS as DEFAULT_CALIBRATION_TOKENS

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
METHODS = ("pca", "mean", "first", "random")
DEFAULT_METHOD = "pca"  # measured: ~160x lower held-out perplexity than mean on SmolLM2 3 -> 1 KV heads


@dataclass(frozen=True)
class ConversionReport:
    """What a conversion changed; ``kv_cache_reduction`` = old KV heads / new KV heads."""

    model_type: str
    num_attention_heads: int
    kv_heads_before: int
    kv_heads_after: int
    method: str
    num_layers: int
    head_dim: int
    kv_cache_bytes_per_token_before: int
    kv_cache_bytes_per_token_after: int
    params_before: int
    params_after: int
    calibration: dict | None = None  # pca: what the second moments were measured on
    perplexity: dict | None = None  # convert_checkpoint: held-out perplexity before / after, when measured

    @property
    def kv_cache_reduction(self) -> float:
        return self.kv_heads_before / self.kv_heads_after

    def summary(self) -> str:
        kind = "MQA" if self.kv_heads_after == 1 else ("MHA" if self.kv_heads_after == self.num_attention_heads else "GQA")
        lines = [
            f"{self.model_type}: {self.num_attention_heads} query heads, KV heads {self.kv_heads_before} -> "
            f"{self.kv_heads_after} ({kind}, method={self.method})",
            f"KV cache per token: {self.kv_cache_bytes_per_token_before} -> {self.kv_cache_bytes_per_token_after} bytes "
            f"({self.num_layers} layers x 2 x heads x {self.head_dim} x dtype): "
            f"reduction x{self.kv_cache_reduction:g}",
            f"parameters: {self.params_before:,} -> {self.params_after:,}",
        ]
        if self.kv_heads_before == self.kv_heads_after:
            lines.append("target equals the current KV head count: identity, nothing changed")
        if self.calibration:
            c = self.calibration
            lines.append(f"calibration: {c['tokens']:,} tokens of {c['data']}, {c['seconds']} s")
        if self.perplexity:
            p = self.perplexity
            lines.append(f"held-out perplexity ({p['tokens']:,} tokens of {p['data']}): "
                         f"{p['before']:.2f} -> {p['after']:.2f}")
        return "\n".join(lines)


def load_tokenizer(path):
    """The checkpoint's tokenizer, or None when it has none (it still converts; pca then calibrates on random ids)."""
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError):
        return None


def load_convertible(model_or_path, num_key_value_heads: int, method: str, dtype=None):
    """A loaded model as is, or a checkpoint folder loaded after its config passed the checks."""
    if isinstance(model_or_path, nn.Module):
        return model_or_path
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_or_path)
    check_convertible(config, num_key_value_heads, method)
    architectures = getattr(config, "architectures", None) or []
    if architectures and not any(name.endswith("ForCausalLM") for name in architectures):
        raise ValueError(f"the checkpoint is a {', '.join(architectures)}, not a causal LM: the converter writes "
                         "*ForCausalLM checkpoints and would drop its own head (convert a ForCausalLM checkpoint)")
    model, loading = AutoModelForCausalLM.from_pretrained(model_or_path, dtype=dtype or "auto", output_loading_info=True)
    if loading.get("missing_keys"):  # e.g. a bare decoder without lm_head: the converted model would be random there
        raise ValueError(f"the checkpoint lacks weights a {type(model).__name__} needs: "
                         f"{sorted(loading['missing_keys'])[:8]}")  # fmt: skip
    return model


def _attention_modules(model: nn.Module):
    """Every decoder self-attention module (has ``k_proj``, ``v_proj`` and ``num_key_value_groups``)."""
    found = [m for m in model.modules() if hasattr(m, "k_proj") and hasattr(m, "v_proj")]
    if not found:
        raise ValueError(f"no attention module with k_proj/v_proj found in {type(model).__name__}")
    return found


def check_convertible(config, num_key_value_heads: int, method: str = "mean") -> None:
    """Raise a ValueError naming what was received if ``config`` cannot go to ``num_key_value_heads``."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"unsupported model_type {model_type!r}: the converter handles {', '.join(SUPPORTED_MODEL_TYPES)} "
            "(their K/V projections are k_proj/v_proj with consecutive head grouping)"
        )
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    heads = config.num_attention_heads
    kv_heads = config.num_key_value_heads or heads
    if not isinstance(num_key_value_heads, int) or isinstance(num_key_value_heads, bool) or num_key_value_heads < 1:
        raise ValueError(f"num_key_value_heads must be a positive int, got {num_key_value_heads!r}")
    if kv_heads % num_key_value_heads != 0:
        divisors = [d for d in range(1, kv_heads + 1) if kv_heads % d == 0]
        raise ValueError(
            f"num_key_value_heads={num_key_value_heads} must divide the current {kv_heads} KV heads "
            f"(pooling merges whole groups of consecutive heads); possible values: {divisors}"
        )


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def pool_heads(tensor: torch.Tensor, kv_heads: int, target: int, method: str) -> torch.Tensor:
    """Pool a K/V projection weight ``(kv_heads * head_dim, in)`` or bias ``(kv_heads * head_dim,)``.

    Rows are ``kv_heads`` blocks of ``head_dim`` rows, one per head; consecutive blocks of
    ``g = kv_heads // target`` heads are merged (``mean``) or reduced to their first (``first``).
    """
    group = kv_heads // target
    grouped = tensor.reshape(target, group, tensor.shape[0] // kv_heads, *tensor.shape[1:])  # (H_new, g, D, [in])
    if method == "mean":
        # Accumulate in fp32 so bf16/fp16 checkpoints pool without extra rounding; equal heads stay exact.
        pooled = grouped.float().mean(dim=1).to(tensor.dtype)
    elif method == "first":
        pooled = grouped[:, 0]
    else:
        raise ValueError(f"pool_heads handles mean/first, got {method!r}")
    return pooled.reshape(target * tensor.shape[0] // kv_heads, *tensor.shape[1:]).contiguous()  # (H_new*D, [in])


def repeat_heads(tensor: torch.Tensor, kv_heads: int, factor: int) -> torch.Tensor:
    """The inverse direction: each of ``kv_heads`` head blocks repeated ``factor`` times, consecutively."""
    grouped = tensor.reshape(kv_heads, 1, tensor.shape[0] // kv_heads, *tensor.shape[1:])  # (H_kv, 1, D, [in])
    expanded = grouped.expand(kv_heads, factor, *grouped.shape[2:])  # (H_kv, factor, D, [in])
    return expanded.reshape(kv_heads * factor * grouped.shape[2], *tensor.shape[1:]).contiguous()


def _new_linear(old: nn.Linear, weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    layer = nn.Linear(old.in_features, weight.shape[0], bias=old.bias is not None, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        layer.weight.copy_(weight)
        if old.bias is not None:
            layer.bias.copy_(bias)
    layer.weight.requires_grad_(old.weight.requires_grad)
    return layer


def _set_kv_heads(model: nn.Module, attention_modules, num_key_value_heads: int) -> None:
    config = model.config
    config.num_key_value_heads = num_key_value_heads
    groups = config.num_attention_heads // num_key_value_heads
    for module in attention_modules:
        # eager attention's repeat_kv reads num_key_value_groups; other backends take shapes from tensors.
        module.num_key_value_groups = groups
        if hasattr(module, "num_key_value_heads"):
            module.num_key_value_heads = num_key_value_heads
        if getattr(module, "config", None) is not None and module.config is not config:
            module.config.num_key_value_heads = num_key_value_heads


def _pca_merge(model: nn.Module, modules, num_key_value_heads: int, *, tokenizer, calibration_ids, calibration_tokens,
               seed: int, progress: bool, text_source: str, text_cache) -> dict:
    """Calibrate, then give every attention module its merged q/k/v/o weights; returns the calibration details."""
    from .gqa_calibration import calibrate, decoder_layers
    from .gqa_merge import check_rope_pairs, merge_attention

    check_rope_pairs(model)
    moments, details = calibrate(model, tokenizer=tokenizer, ids=calibration_ids, tokens=calibration_tokens,
                                 seed=seed, source=text_source, cache_dir=text_cache, progress=progress)
    layers = decoder_layers(model)
    if [layer.self_attn for layer in layers] != list(modules):
        raise ValueError(f"{type(model).__name__}: decoder layers and attention modules do not pair up one to one")
    for layer, moment in zip(layers, moments):
        module = layer.self_attn
        # Qwen3's k_norm/q_norm (shared by all heads) break the exact key maps: keys are mean-pooled there.
        merged = merge_attention(module, moment, num_key_value_heads, exact_keys=not hasattr(module, "k_norm"))
        with torch.no_grad():  # q_proj and o_proj keep their shapes: new values, same parameters
            module.q_proj.weight.copy_(merged.q_weight)
            if merged.q_bias is not None:
                module.q_proj.bias.copy_(merged.q_bias)
            module.o_proj.weight.copy_(merged.o_weight)
        module.k_proj = _new_linear(module.k_proj, merged.k_weight, merged.k_bias)
        module.v_proj = _new_linear(module.v_proj, merged.v_weight, merged.v_bias)
    return details | {"key_merge": "mean (shared k_norm: approximate)" if hasattr(modules[0], "k_norm")
                      else "rank-1 per RoPE pair, complex factors folded into q_proj (exact maps)",
                      "value_merge": "rank-d under the o_proj-weighted second moment, maps folded into o_proj"}


def _report(config, before_kv, after_kv, method, params_before, params_after, dtype) -> ConversionReport:
    head_dim, layers = _head_dim(config), config.num_hidden_layers
    itemsize = torch.empty((), dtype=dtype).element_size()
    per_token = lambda kv: layers * 2 * kv * head_dim * itemsize  # noqa: E731  (K and V, every layer)
    return ConversionReport(
        model_type=config.model_type,
        num_attention_heads=config.num_attention_heads,
        kv_heads_before=before_kv,
        kv_heads_after=after_kv,
        method=method,
        num_layers=layers,
        head_dim=head_dim,
        kv_cache_bytes_per_token_before=per_token(before_kv),
        kv_cache_bytes_per_token_after=per_token(after_kv),
        params_before=params_before,
        params_after=params_after,
    )


def convert_to_gqa(model_or_path, num_key_value_heads: int, *, method: str = DEFAULT_METHOD, seed: int = 0,
                   return_report: bool = False, tokenizer=None, calibration_ids: torch.Tensor | None = None,
                   calibration_tokens: int = DEFAULT_CALIBRATION_TOKENS, progress: bool = True,
                   text_source: str = "auto", text_cache=None):
    """Merge the K/V heads of a Llama/Mistral/Qwen2/Qwen3 model down to ``num_key_value_heads``.

    ``model_or_path``: a loaded ``*ForCausalLM`` (converted in place) or a local checkpoint folder.
    Returns the model, or ``(model, ConversionReport)`` with ``return_report=True``. Converting to the
    current KV head count is an identity (no weight is touched, whatever the method).

    ``pca`` calibrates first, on the first of: ``calibration_ids`` (``(B, S)`` token ids), else
    ``calibration_tokens`` tokens of the training text of the offline corpus ``text_source``
    (``text_data.SOURCES``, cached under ``text_cache``) through ``tokenizer`` (loaded
    from ``model_or_path`` when that is a folder), else random token ids (worse: not text statistics).
    ``progress`` shows a progress bar while calibrating.
    """
    model = load_convertible(model_or_path, num_key_value_heads, method)
    if tokenizer is None and method == "pca" and not isinstance(model_or_path, nn.Module):
        tokenizer = load_tokenizer(model_or_path)
    config = model.config
    check_convertible(config, num_key_value_heads, method)
    kv_heads = config.num_key_value_heads or config.num_attention_heads
    params_before = sum(p.numel() for p in model.parameters())
    modules = _attention_modules(model)
    dtype = modules[0].k_proj.weight.dtype
    calibration = None
    if num_key_value_heads != kv_heads and method == "pca":
        calibration = _pca_merge(model, modules, num_key_value_heads, tokenizer=tokenizer,
                                 calibration_ids=calibration_ids, calibration_tokens=calibration_tokens,
                                 seed=seed, progress=progress, text_source=text_source, text_cache=text_cache)
        _set_kv_heads(model, modules, num_key_value_heads)
    elif num_key_value_heads != kv_heads:
        generator = torch.Generator().manual_seed(seed)
        std = getattr(config, "initializer_range", 0.02)
        for module in modules:
            for name in ("k_proj", "v_proj"):
                old: nn.Linear = getattr(module, name)
                if method == "random":
                    out_features = old.out_features // kv_heads * num_key_value_heads
                    weight = torch.randn(out_features, old.in_features, generator=generator) * std
                    bias = torch.zeros(out_features) if old.bias is not None else None
                    weight = weight.to(old.weight.device, old.weight.dtype)
                    bias = bias.to(old.weight.device, old.weight.dtype) if bias is not None else None
                else:
                    weight = pool_heads(old.weight.data, kv_heads, num_key_value_heads, method)
                    bias = pool_heads(old.bias.data, kv_heads, num_key_value_heads, method) if old.bias is not None else None
                setattr(module, name, _new_linear(old, weight, bias))
        _set_kv_heads(model, modules, num_key_value_heads)
    report = _report(config, kv_heads, num_key_value_heads, method, params_before,
                     sum(p.numel() for p in model.parameters()), dtype)
    report = replace(report, calibration=calibration)
    return (model, report) if return_report else model


def expand_kv_heads(model: nn.Module, num_key_value_heads: int) -> nn.Module:
    """Repeat each KV head so the model has ``num_key_value_heads`` (e.g. GQA -> an exact MHA twin).

    Head ``j`` is copied to heads ``j*f .. j*f + f - 1`` (``f`` = new / old), the layout ``repeat_kv``
    produces at run time, so the expanded model computes the same function.
    """
    config = model.config
    kv_heads = config.num_key_value_heads or config.num_attention_heads
    if not isinstance(num_key_value_heads, int) or isinstance(num_key_value_heads, bool) or num_key_value_heads < 1:
        raise ValueError(f"num_key_value_heads must be a positive int, got {num_key_value_heads!r}")
    if num_key_value_heads % kv_heads or config.num_attention_heads % num_key_value_heads:
        raise ValueError(
            f"num_key_value_heads={num_key_value_heads} must be a multiple of the current {kv_heads} KV heads "
            f"and divide the {config.num_attention_heads} query heads"
        )
    factor = num_key_value_heads // kv_heads
    modules = _attention_modules(model)
    for module in modules:  # a k_norm over the whole projection (OLMo2) would need its weight repeated too
        k_norm = getattr(getattr(module, "k_norm", None), "weight", None)
        if k_norm is not None and k_norm.numel() != _head_dim(config):
            raise ValueError(f"{type(module).__name__}: its k_norm spans the whole K projection ({k_norm.numel()} "
                             f"weights, head dim {_head_dim(config)}); expanding its heads is not supported")
    for module in modules:
        for name in ("k_proj", "v_proj"):
            old: nn.Linear = getattr(module, name)
            weight = repeat_heads(old.weight.data, kv_heads, factor)
            bias = repeat_heads(old.bias.data, kv_heads, factor) if old.bias is not None else None
            setattr(module, name, _new_linear(old, weight, bias))
    _set_kv_heads(model, modules, num_key_value_heads)
    return model
