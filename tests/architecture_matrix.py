"""The coverage matrix's rows and machinery, and the docs table it checks against (``docs/architectures.md``).

Rows come from transformers itself (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``); each runnable row builds a tiny
random model and its unpatched twin. The tests are ``tests/test_architectures.py`` (CPU) and
``tests/gpu/test_architectures_gpu.py``. ``python tests/architecture_matrix.py`` rewrites the docs table.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import functools
import inspect
import re
import warnings
from pathlib import Path

import pytest
import torch
import transformers
from transformers import AttentionInterface, AutoConfig, AutoModelForCausalLM, GenerationConfig
from transformers.models.auto import modeling_auto
from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES

import hf_flashpatch
import hf_flashpatch.api
from hf_flashpatch.backend import attention as attention_module
from hf_flashpatch.backend import paged as paged_module
from hf_flashpatch.backend import unpatchable, unsupported

NAME = hf_flashpatch.ATTN_NAME
VOCAB = 128
NEW_TOKENS = 5
DOCS = Path(__file__).resolve().parents[1] / "docs" / "architectures.md"

# Run by default (about 3 s a row): the families issue 16 names, one per attention feature. The rest: -m slow.
REPRESENTATIVE = (
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma2", "gemma3_text", "phi3",
    "olmo2", "granite", "cohere", "starcoder2", "gpt_oss", "deepseek_v3",
)  # fmt: skip

# Rows that cannot run with our mask format at all: the model code itself reads the 4-D mask that sdpa/eager
# get, and fails on our 2-D key-padding mask before attention is called (transformers gives these models no
# flash-attention support either, for the same reason). patch() refuses them by name (backend/unpatchable.py).
READS_4D_MASK = ("its modeling code reads the 4-D sdpa/eager mask itself ({what}); our 2-D key-padding mask cannot: "
                 "patch() refuses it (UnsupportedModel)")
KNOWN_SKIPS = {
    **{model_type: READS_4D_MASK.format(what=what) for model_type, what in unpatchable.READS_4D_MASK.items()},
    "blt": "no tiny configuration yet for its four sub-models (byte patcher, local encoder and decoder, global "
    "transformer); its default one allocates over 10 GB",
}
# Rows that run and give a wrong answer today: semantics that live only in transformers' mask function, which
# our registered mask function (masks.py) drops. They stay visible (strict xfail) until masks.py handles them.
KNOWN_WRONG: dict[str, str] = {}  # llama4_text (chunked) and phimoe (window only in the mask) were; now served

# Fields every tiny config gets, where the config class has them (attribute_map names are followed).
TINY = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rotary_dim=8, attention_dropout=0.0,
    # mixture of experts
    moe_intermediate_size=32, shared_expert_intermediate_size=32, shared_intermediate_size=32, n_routed_experts=4,
    num_experts=4, num_local_experts=4, num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1,
    first_k_dense_replace=1, num_dense_layers=1,
    # multi-head latent attention (DeepSeek-V2/V3): q/k head dim 16 + 8, value head dim 16
    kv_lora_rank=32, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
    pad_token_id=0, bos_token_id=1, eos_token_id=2,
)  # fmt: skip
# The same rows at head dims the CUDA kernels take (TINY's 16 is served by the torch fallback only): 64, and
# for multi-head latent attention DeepSeek-V3's own 192 (128 + 64 rotary) / 128.
KERNEL_SIZES = dict(
    hidden_size=256, intermediate_size=256, head_dim=64, rotary_dim=32,
    kv_lora_rank=64, q_lora_rank=64, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
)  # fmt: skip
WINDOW = 6  # sliding windows and attention chunks: shorter than the test sequences, so they matter
MAMBA = dict(mamba_n_heads=8, mamba_d_state=16, mamba_chunk_size=16)  # the head width follows the hidden size
# What a few configs need beyond TINY (most need nothing).
SPECIAL = {
    "dbrx": dict(attn_config=dict(kv_n_heads=2, rope_theta=1e4, clip_qkv=8.0),
                 ffn_config=dict(ffn_hidden_size=128, moe_num_experts=4, moe_top_k=2)),
    "dory": dict(num_hidden_layers=3, n_input_layers=1, n_recurrent_layers=1, n_output_layers=1),
    "lfm2_moe": dict(layer_types=["conv", "full_attention"]),
    "longcat_flash": dict(ffn_hidden_size=128, expert_ffn_hidden_size=32, moe_topk=2, zero_expert_num=2, head_dim=8),
    "cohere_compass_text": dict(  # RoPE parameters per layer type
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={kind: dict(rope_type="default", rope_theta=1e4) for kind in ("sliding_attention",
                                                                                      "full_attention")},
    ),
    "zaya": dict(num_experts_per_tok=1),
    "moshi": dict(depth_decoder_config=None),  # its default depth decoder is small; a shrunk one fails validation
    "recurrent_gemma": dict(block_types=["recurrent", "attention"]),
    "gemma3n_text": dict(num_kv_shared_layers=0, layer_types=["sliding_attention", "full_attention"]),
    "zamba": dict(num_hidden_layers=6, attn_layer_period=2, attn_layer_offset=1),  # shares one block: >= 2 uses
    "zamba2": dict(layer_types=["linear_attention", "hybrid"], hybrid_layer_ids=[1]),
    "jamba": dict(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1),
    # mamba hybrids: a small state space (the defaults' 128 heads x 256 states made transformers 5.17's mamba code
    # allocate 24 GB at the tiny sizes)
    "bamba": dict(attn_layer_indices=[1], **MAMBA),
    "falcon_h1": dict(**MAMBA),
    "granitemoehybrid": dict(layer_types=["mamba", "attention"], **MAMBA),
    # its indexer scores with the query heads of K/V head 0 (at most the group), from pools of whole blocks
    "kolibri1_1": dict(index_num_heads=2, index_topk=8, index_pool_size=32, index_compression=4,
                       index_num_local_tokens=4, index_num_sink_tokens=2),
}  # fmt: skip


# ---------------------------------------------------------------------------------------------- the rows


@dataclasses.dataclass(frozen=True)
class Row:
    model_type: str
    class_name: str
    skip: str | None = None  # why the row does not run (None: it runs)


@functools.lru_cache(maxsize=1)
def _modeling_sources() -> dict[str, str]:
    """Model class name -> the source of the modeling file that defines it. Read as text: importing the ~200
    modeling modules would cost seconds at every collection, and their objects slow every later gc pass."""
    sources = {}
    for path in sorted((Path(transformers.__file__).parent / "models").glob("*/modeling_*.py")):
        text = path.read_text()
        for name in re.findall(r"^class (\w+)\(", text, flags=re.M):
            sources.setdefault(name, text)
    return sources


def _config_class_name(class_name: str) -> str | None:
    """The config class a model class is built from, as its ``__init__`` annotates it."""
    text = _modeling_sources().get(class_name, "")
    body = re.search(rf"^class {class_name}\(.*?(?=^class |\Z)", text, flags=re.M | re.S)
    found = re.search(r"def __init__\(self, config: (\w+)", body.group(0)) if body else None
    return found.group(1) if found else None


def _owners() -> dict[str, str]:
    """Model class name -> the row that owns it (several model types may share a class, e.g. gpt2 and gpt-sw3):
    the model type of the class's config, else the first that names it."""
    items = modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()
    owner: dict[str, str] = {}
    for model_type, class_name in items:
        config_name = CONFIG_MAPPING_NAMES.get(model_type)
        if config_name == _config_class_name(class_name) and CONFIG_MAPPING[model_type].model_type == model_type:
            owner.setdefault(class_name, model_type)
    for model_type, class_name in items:
        owner.setdefault(class_name, model_type)
    return owner


@functools.lru_cache(maxsize=1)
def architecture_rows() -> dict[str, Row]:
    """Every causal-LM model type of the installed transformers, each with why it does not run, if it does not."""
    owner = _owners()
    return {
        model_type: Row(model_type, class_name, _skip_reason(model_type, class_name, owner))
        for model_type, class_name in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()
    }


def _skip_reason(model_type: str, class_name: str, owner: dict[str, str]) -> str | None:
    config_class = CONFIG_MAPPING[model_type]
    if model_type in modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return "an encoder with a causal-LM head (also a masked LM), not decoder-only"
    if (
        model_type in modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES
        or getattr(config_class, "is_encoder_decoder", False)
        or "decoder" in (getattr(config_class, "sub_configs", None) or {})  # musicgen: text encoder + decoder
    ):
        return "the decoder of an encoder-decoder model, not decoder-only"
    if owner[class_name] != model_type:
        return f"the same model class as row {owner[class_name]} ({class_name})"
    if not class_name.endswith(("ForCausalLM", "LMHeadModel")):
        return f"{class_name} is not a plain causal LM (a multimodal model or an encoder's decoder head)"
    source = _modeling_sources().get(class_name, "")
    if "ALL_ATTENTION_FUNCTIONS" not in source and "AutoModel" in source:
        return "its decoder is another architecture's (built with AutoModel from a sub-config), which has its own row"
    if "ALL_ATTENTION_FUNCTIONS" not in source:
        return "no attention through AttentionInterface (its own attention code, or none): patch() refuses it (UnsupportedModel)"
    return KNOWN_SKIPS.get(model_type)


# ---------------------------------------------------------------------------------------- tiny configs


def _fields(config_class) -> set[str]:
    try:
        return {f.name for f in dataclasses.fields(config_class)}
    except TypeError:  # not a dataclass: the constructor's parameters
        return set(inspect.signature(config_class.__init__).parameters)


def _tiny_kwargs(config_class, model_type: str | None, sizes: dict | None = None) -> dict:
    fields, names = _fields(config_class), getattr(config_class, "attribute_map", {}) or {}
    tiny = {**TINY, **(sizes or {})}
    kwargs = {names.get(key, key): value for key, value in tiny.items() if names.get(key, key) in fields}
    if "kv_lora_rank" in fields:  # multi-head latent attention: as many K/V heads as query heads
        kwargs["num_key_value_heads"] = tiny["num_attention_heads"]
    for field in ("sliding_window", "sliding_window_size", "attention_chunk_size"):
        if field in fields:
            kwargs[field] = WINDOW
    kwargs.update(SPECIAL.get(model_type, {}))
    default = config_class()
    layer_types = getattr(default, "layer_types", None)
    if "layer_types" in fields and "layer_types" not in kwargs and isinstance(layer_types, list):
        kinds = list(dict.fromkeys(layer_types))  # one layer of each kind the architecture mixes, in their order
        kwargs["num_hidden_layers"] = layers = max(len(kinds), kwargs.get("num_hidden_layers", 0))
        kwargs["layer_types"] = (kinds * layers)[:layers]
    for name, sub_class in (getattr(default, "sub_configs", None) or {}).items():  # vision towers etc.: tiny too
        if name not in kwargs and isinstance(sub_class, type) and sub_class is not AutoConfig:
            kwargs[name] = _tiny_kwargs(sub_class, None)
    return kwargs


def tiny_config(model_type: str, sizes: dict | None = None):
    """A tiny random config of ``model_type``: :data:`TINY`, with ``sizes`` (e.g. :data:`KERNEL_SIZES`) over it."""
    config_class = CONFIG_MAPPING[model_type]
    return config_class(**_tiny_kwargs(config_class, model_type, sizes))


# -------------------------------------------------------------------------------------------- models


def reference_name(model) -> str:
    """What the patched model is compared with: sdpa, or eager where the architecture has no sdpa."""
    return "sdpa" if type(model)._supports_sdpa else "eager"


@functools.lru_cache(maxsize=2)
def twin_models(model_type: str):
    """The same tiny random weights, patched and under the reference (each with its own config object:
    ``set_attn_implementation`` writes into the config, so a shared one would patch both)."""
    config = tiny_config(model_type)
    torch.manual_seed(0)
    try:
        ref = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="eager").eval()
    except Exception as exc:  # noqa: BLE001 - on the docs' release a row that cannot be built is a failure
        made_with = docs_table()[0]
        if made_with in (None, transformers.__version__):
            raise
        pytest.skip(f"no tiny {model_type} model on transformers {transformers.__version__} (the rows are tuned for "
                    f"{made_with}): {type(exc).__name__}: {exc}")  # fmt: skip
    ref.set_attn_implementation(reference_name(ref))
    ours = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="eager").eval()
    ours.load_state_dict(ref.state_dict())
    hf_flashpatch.patch(ours)
    assert ours.config._attn_implementation == NAME and ref.config._attn_implementation != NAME
    return ours, ref


def padded_batch(lengths=(9, 4, 7), total=9, seed=1):
    """Left-padded token ids ``(B, total)`` and their 0/1 mask; real tokens are ids >= 3 (0 pads)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(lengths), total, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        ids[row, total - length :] = torch.randint(3, VOCAB, (length,), generator=gen)
        mask[row, total - length :] = 1
    return ids, mask


# --------------------------------------------------------------------------- what serves the attention


def _routed_in_backend() -> bool:
    """True once attention.py routes to the fallback itself (it imports :mod:`unsupported`)."""
    return getattr(attention_module, "unsupported", None) is unsupported


def routed_attention(module, query, key, value, attention_mask, **kwargs):
    """``attention_forward`` with issue 16's routing in front (what attention.py does once it routes itself)."""
    named = {k: kwargs.pop(k) for k in ("dropout", "scaling", "sliding_window", "softcap", "is_causal") if k in kwargs}
    reason = unsupported.fallback_reason(query, key, value, attention_mask, kwargs)
    if reason is not None:
        return unsupported.fallback_attention(module, query, key, value, attention_mask, reason=reason, **named,
                                              **kwargs)  # fmt: skip
    return attention_module.attention_forward(module, query, key, value, attention_mask, **named, **kwargs)


@contextlib.contextmanager
def serving():
    """Counts what serves attention: ``"our kernels"`` (calls into the public API) and each fallback reason;
    ``counts.value_head_dims`` collects the ``(D, D_v)`` of API calls whose V has a head dim of its own.
    Routes to the fallback as attention.py will, while it does not yet; warnings start afresh."""
    counts: collections.Counter = collections.Counter()
    counts.value_head_dims = set()

    def counted(label, function):
        def wrapper(*args, **kwargs):  # the fallback's label is its reason (recomputed if the caller passed none)
            counts[label or kwargs.get("reason") or unsupported.fallback_reason(*args[1:5], kwargs)] += 1
            if label and args[2].shape[-1] != args[0].shape[-1]:  # an API call: q, k, v first
                counts.value_head_dims.add((args[0].shape[-1], args[2].shape[-1]))
            return function(*args, **kwargs)

        return wrapper

    with pytest.MonkeyPatch.context() as patcher:
        api = hf_flashpatch.api
        for name in ("flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"):
            patcher.setattr(api, name, counted("our kernels", getattr(api, name)))
        patcher.setattr(unsupported, "fallback_attention", counted(None, unsupported.fallback_attention))
        patcher.setattr(unsupported, "_warned", set())
        if not _routed_in_backend():
            patcher.setitem(AttentionInterface._global_mapping, NAME, routed_attention)
            patcher.setattr(paged_module, "attention_forward", routed_attention)  # continuous batching's name
        yield counts


def what_runs(counts) -> str:
    """The table's "what runs" cell for what :func:`serving` counted."""
    parts = ["our kernels"] if counts["our kernels"] else []
    parts += [f"fallback ({reason})" for reason in sorted(r for r in counts if r != "our kernels")]
    return " + ".join(parts) or "no attention call"


# ------------------------------------------------------------------------------------------- the docs


def docs_table() -> tuple[str | None, dict[str, str]]:
    """(the transformers version the table was made with, model type -> its "what runs" cell)."""
    if not DOCS.exists():
        return None, {}
    text = DOCS.read_text()
    version = re.search(r"transformers (\d+\.\d+\.\S+?)[\s.,)]", text)
    rows = re.findall(r"^\| `([^`]+)` \| [^|]* \| ([^|]*?) \|", text, flags=re.M)
    return (version.group(1) if version else None), dict(rows)


def documented(model_type: str) -> str | None:
    """The docs' cell for a row, or None when the docs were made with another transformers."""
    version, rows = docs_table()
    return rows.get(model_type) if version == transformers.__version__ else None


# ------------------------------------------------------------------------------ running the twins


GREEDY = dict(max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0, eos_token_id=None)


PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [14, 15, 16], [17, 18, 19, 20, 21, 22, 23]]


def batch_generate(model) -> list[list[int]]:
    """``generate_batch`` on a small page pool (the default one is sized from free memory: slow on a CPU)."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    settings = GenerationConfig(**GREEDY)
    pool = ContinuousBatchingConfig(num_blocks=16, max_batch_tokens=64)
    results = model.generate_batch(inputs=PROMPTS, generation_config=settings, continuous_batching_config=pool,
                                   progress_bar=False)  # fmt: skip
    by_prompt = {tuple(r.prompt_ids): list(r.generated_tokens) for r in results.values()}
    tokens = [by_prompt.get(tuple(p), []) for p in PROMPTS]
    if any(len(t) != NEW_TOKENS for t in tokens):  # failed requests come back short, without an exception
        raise RuntimeError(f"generate_batch returned {[len(t) for t in tokens]} tokens, wanted {NEW_TOKENS} each")
    return tokens


def _reference_or_skip(run, what: str, model, model_type: str):
    """The reference run; a skip naming transformers' error when the architecture cannot do ``what`` at all."""
    try:
        return run()
    except Exception as exc:  # noqa: BLE001 - whatever transformers raises: nothing to compare with
        pytest.skip(f"transformers' {model.config._attn_implementation} cannot {what} {model_type}: "
                    f"{type(exc).__name__}: {exc}")  # fmt: skip


# ------------------------------------------------------------------------ the docs table, regenerated

WHY = {
    unsupported.SINKS: "attention sinks (`s_aux`) of a shape other than one logit per query head; sdpa cannot "
    "take them: the model's own eager attention",
    unsupported.VALUE_HEAD_DIM: "multi-head latent attention in a decode step on a device with the kernels, at a "
    "q/k, v head-dim pair no decode kernel is built for (192/128 is): transformers' sdpa",
    unsupported.HEAD_DIM: "Q/K head dim above 256 (Gemma 4's global layers: 512): transformers' sdpa for those "
    "layers, our kernels for the rest",
    unsupported.POSITION_BIAS: "an additive relative-position score bias: transformers' sdpa, which adds it",
    unsupported.UNKNOWN_KWARG: "a keyword the kernels do not implement: the model's own eager attention",
    unsupported.MASK_4D: "a 4-D mask built by the model: transformers' sdpa with that mask",
}
SERVED_VALUE_HEAD_DIM = ("multi-head latent attention (V's head dim differs from Q/K's): our kernels, the decode "
                         "kernels at 192/128 and, on a GPU, transformers' sdpa for decode steps of other pairs "
                         "(`value head dim`)")
HEADER = """# Architectures

What `hf_flashpatch.patch(model)` runs for every causal-LM architecture of transformers {version}, one row
per model type. Generated by `python tests/architecture_matrix.py` (which rewrites this file); the test
module `tests/test_architectures.py` checks every row against it: a tiny random model, patched, against
`sdpa` (or `eager` where the architecture has no sdpa) on a left-padded batch, a cached greedy `generate`
and `generate_batch`. Its default run covers {representative}; `-m slow` runs every row.

- **our kernels**: every attention call runs on hf_flashpatch's kernels (their torch fallback on CPU).
  Multi-head latent attention (DeepSeek-V2/V3 and its family: V's head dim differs from Q/K's) runs on the
  kernels at any pair (`hf_flashpatch/kernels/value_head_dim.py`): on Hopper at 192/128 (DeepSeek-V2/V3) a
  native forward and backward kernel (the backward with softcap or `deterministic=True` padded), elsewhere both on
  inputs zero-padded to one kernel head dim (exact), and the decode kernels at 192/128 directly; on a GPU the decode steps of other pairs
  take transformers' sdpa with one `value head dim` warning, which this CPU-made table lists in the row's
  "why", not in "what runs".
- **fallback (reason)**: calls our kernels cannot serve go to transformers' own sdpa or eager attention
  (`hf_flashpatch/backend/unsupported.py`), with one warning per reason; never a wrong answer. Where a
  row lists both, some layers run on our kernels and some on the fallback.
- **not run**: the row is not a decoder-only model that routes attention through `AttentionInterface`, or
  its modeling code needs a mask our backend does not give (the reason says which). `patch()` refuses
  both kinds with `hf_flashpatch.UnsupportedModel` naming why, and leaves the model as it was.
- **wrong answer today**: rows whose attention semantics live only in transformers' mask function, which
  our mask function drops; their tests are expected failures until it handles them.

| architecture | model class | what runs | why |
| --- | --- | --- | --- |
"""


def table_row(model_type: str) -> str:
    row = architecture_rows()[model_type]
    if row.skip is not None:
        runs, why = "not run", " ".join(row.skip.split())
    else:
        ours, _ = twin_models(model_type)
        ids, mask = padded_batch()
        with serving() as counts, warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            ours(input_ids=ids, attention_mask=mask)
        runs = what_runs(counts)
        why = "; ".join(WHY[reason] for reason in sorted(r for r in counts if r != "our kernels"))
        if counts.value_head_dims:
            why = "; ".join(filter(None, [SERVED_VALUE_HEAD_DIM, why]))
        if model_type in KNOWN_WRONG:
            why = f"**wrong answer today**: {KNOWN_WRONG[model_type]}" + (f"; {why}" if why else "")
    return f"| `{model_type}` | {row.class_name} | {runs} | {why} |"


def main() -> None:
    warnings.simplefilter("ignore")
    transformers.logging.set_verbosity_error()
    lines = [table_row(model_type) for model_type in sorted(architecture_rows())]
    representative = ", ".join(f"`{m}`" for m in REPRESENTATIVE)
    header = HEADER.format(version=transformers.__version__, representative=representative)
    DOCS.write_text(header + "\n".join(lines) + "\n")
    print(f"wrote {DOCS} ({len(lines)} rows)")


if __name__ == "__main__":
    main()
