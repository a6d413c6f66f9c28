"""Demo: patch a real pretrained model, check it against transformers' ``sdpa``, generate.

    python -m hf_flashpatch.cli demo [--model PATH] [--device cuda|cpu] [--dtype auto|float32|bfloat16|float16]
                                     [--max-new-tokens N] [--prompt TEXT]

Loads the model once (default: the shipped SmolLM2-135M-Instruct GGUF, see :mod:`hf_flashpatch.models`),
runs a left-padded batch of prompts under ``sdpa``, switches the same model with
:func:`hf_flashpatch.patch`, runs the batch again and compares the logits at the real (non-pad) tokens,
then generates greedily with the patched model and reports tokens/s and which path served the attention
(the CUDA kernels, or the torch fallback and why).

Pass criterion (exit status 1 otherwise): in float32 the patched logits are within ``FP32_ATOL`` of sdpa's.
In bf16/fp16 both backends round differently, so we also run sdpa in float32 as the reference and require
our error against it to be at most twice sdpa's own error plus ``HALF_EPS`` (the project's error bound).
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import torch

FP32_ATOL = 2e-3  # 30 layers of fp32 with a different summation order stay well inside this
HALF_EPS = 0.05  # slack for the half-precision bound, in logit units

DEFAULT_PROMPTS = [
    "The capital of France is",
    "Water boils at a temperature of one hundred degrees Celsius, which is",
    "def fibonacci(n):",
]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")


def checkpoint_folder(text: str) -> str:
    """argparse type for ``--model``: a folder with a transformers config and a tokenizer, checked here
    so that the user reads what is missing rather than whatever the loader trips on first (a folder
    without tokenizer files makes transformers ask for sentencepiece)."""
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"no such folder: {text}")
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, expected a checkpoint folder")
    if not (path / "config.json").is_file():
        raise argparse.ArgumentTypeError(f"{text} is not a model checkpoint (no config.json)")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise argparse.ArgumentTypeError(
            f"{text} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); the demo needs one to encode "
            "the prompts: save it there with tokenizer.save_pretrained"
        )
    return text


def device_name(text: str) -> str:
    """argparse type for ``--device``: ``cpu`` or ``cuda[:N]`` that exists on this machine."""
    try:
        device = torch.device(text)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"expected cpu or cuda[:N], got {text!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"got {text!r} but CUDA is not available here "
                                         f"(torch {torch.__version__}); use --device cpu")  # fmt: skip
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(f"got {text!r} but there are {torch.cuda.device_count()} CUDA device(s)")
    return text


def prompt_text(text: str) -> str:
    """argparse type for ``--prompt``: any text but an empty or blank one (nothing to continue from)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"a prompt must contain text, got {text!r}")
    return text


def parse_args(argv):
    from .cli import ArgumentParser, positive_int

    parser = ArgumentParser(prog="hf-flashpatch demo", description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=checkpoint_folder, default=None,
                        help="local HF checkpoint folder with a tokenizer (default: the shipped SmolLM2-135M)")
    parser.add_argument("--device", type=device_name, default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="auto", choices=["auto", *DTYPES],
                        help="auto: bfloat16 on CUDA, float32 on CPU")  # fmt: skip
    parser.add_argument("--max-new-tokens", type=positive_int, default=20)
    parser.add_argument("--prompt", type=prompt_text, action="append", default=None,
                        help="a prompt (repeatable); the batch is padded on the left")  # fmt: skip
    return parser.parse_args(argv)


def resolve_dtype(name: str, device: str) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return DTYPES[name]


def real_token_logits(model, batch) -> torch.Tensor:
    """Float32 logits at the non-pad positions, ``(num_real_tokens, vocab)``."""
    with torch.no_grad():
        logits = model(**batch).logits  # (B, S, vocab)
    return logits[batch["attention_mask"].bool()].float()


def attention_path(device: str, dtype: torch.dtype, caught: list) -> str:
    """Which implementation served the attention calls, in words."""
    from .kernels import kernels_unavailable_reason

    reasons = sorted({str(w.message) for w in caught if "hf_flashpatch" in str(w.message)})
    if reasons:
        return "torch fallback (" + "; ".join(reasons) + ")"
    reason = kernels_unavailable_reason(torch.empty(0, device=device))
    if reason is not None:
        return f"torch fallback ({reason})"
    if dtype == torch.float32:
        return "torch fallback (float32 is served by torch; the CUDA kernels run fp16/bf16)"
    return "CUDA kernels (PyCUDA)"


def main(argv=None) -> int:
    args = parse_args(argv)
    from . import ATTN_NAME, patch
    from .cli import fail
    from .models import load_model_and_tokenizer

    dtype = resolve_dtype(args.dtype, args.device)
    started = time.perf_counter()
    try:
        model, tokenizer = load_model_and_tokenizer(
            args.model, dtype=dtype, attn_implementation="sdpa", device=args.device
        )
    except (OSError, ImportError, ValueError) as exc:  # unreadable weights, no gguf, an unknown architecture
        first_line = (str(exc).strip().splitlines() or [""])[0]
        return fail("hf-flashpatch demo", f"could not load {args.model or 'the shipped SmolLM2'}: "
                                          f"{type(exc).__name__}: {first_line}")  # fmt: skip
    print(f"loaded {args.model or 'SmolLM2-135M-Instruct (GGUF)'} on {args.device} in {dtype} "
          f"({time.perf_counter() - started:.1f} s)")  # fmt: skip

    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    prompts = args.prompt or DEFAULT_PROMPTS
    batch = tokenizer(prompts, return_tensors="pt", padding=True).to(args.device)
    lengths = batch["attention_mask"].sum(dim=1).tolist()
    print(f"batch: {len(prompts)} prompts, lengths {lengths}, left-padded to {batch['input_ids'].shape[1]}")

    sdpa_logits = real_token_logits(model, batch)
    exact_logits = None
    if dtype != torch.float32:  # the float32 reference for the half-precision bound; the cast back is exact
        exact_logits = real_token_logits(model.float(), batch)
        model.to(dtype)

    patch(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours_logits = real_token_logits(model, batch)
        max_diff = (ours_logits - sdpa_logits).abs().max().item()
        last = torch.tensor(lengths).cumsum(0) - 1  # each prompt's last real token in the flattened rows
        agree = (ours_logits[last].argmax(-1) == sdpa_logits[last].argmax(-1)).sum().item()
        print(f"logits vs sdpa ({ATTN_NAME} patched): max abs diff {max_diff:.3e}; "
              f"greedy next token agrees for {agree}/{len(prompts)} prompts")  # fmt: skip
        if exact_logits is None:
            ok = max_diff <= FP32_ATOL
            print(f"tolerance (float32): {FP32_ATOL:.1e} -> {'PASS' if ok else 'FAIL'}")
        else:
            ours_err = (ours_logits - exact_logits).abs().max().item()
            sdpa_err = (sdpa_logits - exact_logits).abs().max().item()
            bound = 2 * sdpa_err + HALF_EPS
            ok = ours_err <= bound
            print(f"vs float32 sdpa: ours {ours_err:.3e}, sdpa {sdpa_err:.3e}, bound 2*sdpa+{HALF_EPS} = {bound:.3e} "
                  f"-> {'PASS' if ok else 'FAIL'}")  # fmt: skip

        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        started = time.perf_counter()
        with torch.no_grad():
            generated = model.generate(
                **batch, max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - started
    new_tokens = generated[:, batch["input_ids"].shape[1] :]
    count = new_tokens.numel()
    print(f"generated {count} tokens ({len(prompts)} x {new_tokens.shape[1]}) in {elapsed:.2f} s: "
          f"{count / elapsed:.1f} tokens/s")  # fmt: skip
    for prompt, row in zip(prompts, new_tokens):
        print(f"  {prompt!r} -> {tokenizer.decode(row, skip_special_tokens=True)!r}")
    print(f"attention path: {attention_path(args.device, dtype, caught)}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
