"""GQA/MQA conversion quality on a real model and real text: perplexity before, after, and after uptraining.

On SmolLM2-135M (9 query heads, 3 KV heads) and held-out articles of the Wikipedia excerpt gensim ships:

1. exactness: the model with each KV head repeated 3x (an MHA twin) gives the same logits, and merging
   it back (``mean``, and ``pca``) gives the original weights bit for bit;
2. perplexity of the original;
3. converted to ``--kv-heads`` (1 = MQA) with ``pca`` (calibrated on ``--calibration-tokens`` tokens of
   the training articles), ``mean``, ``first`` and ``random``: perplexity of each;
4. the ``--uptrain-from`` models uptrained on ``--uptrain-tokens`` tokens of the training articles
   (``hf_flashpatch.training``, the loop ``scripts/uptrain.py`` runs), then measured again
   (``--uptrain-tokens 0`` skips this);
5. with ``--control``: the original uptrained on the same budget, to separate what uptraining wins back
   from what any training on this text gives.

Writes ``OUT/table.md`` and ``OUT/results.json`` and prints the table.

    python scripts/gqa_quality.py --out runs/gqa_quality                     # a few CPU minutes
    python scripts/gqa_quality.py --eval-sequences 40 --uptrain-tokens 200000 --control
    python scripts/gqa_quality.py --eval-sequences 16 --uptrain-tokens 0    # conversion only, no training
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from hf_flashpatch import ATTN_NAME, text_data
from hf_flashpatch.convert import DEFAULT_CALIBRATION_TOKENS, METHODS, convert_to_gqa, expand_kv_heads
from hf_flashpatch.gqa_calibration import calibration_ids
from hf_flashpatch.models import load_model_and_tokenizer
from hf_flashpatch.training import TrainArgs, evaluate_perplexity, resolve_attn_implementation, train


def _rows_loader(rows, batch_size):
    def collate(batch):
        ids = torch.tensor([row["input_ids"] for row in batch], dtype=torch.long)  # (B, S)
        return {"input_ids": ids, "labels": ids}

    return DataLoader(rows, batch_size=batch_size, collate_fn=collate)


def _exactness(model, batch, calibration_ids) -> dict:
    """MHA twin (each KV head repeated) -> same logits; merged back with mean or pca -> the same weights."""
    kv_heads = model.config.num_key_value_heads
    heads = model.config.num_attention_heads
    with torch.no_grad():
        reference = model(input_ids=batch).logits
        twin = expand_kv_heads(copy.deepcopy(model), heads)
        twin_logits = twin(input_ids=batch).logits
        pooled = convert_to_gqa(twin, kv_heads, method="mean")
        pooled_logits = pooled(input_ids=batch).logits
        merged = convert_to_gqa(expand_kv_heads(copy.deepcopy(model), heads), kv_heads, method="pca",
                                calibration_ids=calibration_ids, progress=False)
        merged_logits = merged(input_ids=batch).logits
    original = model.state_dict()
    weights_equal = all(torch.equal(original[name], tensor) for name, tensor in pooled.state_dict().items())
    return {
        "mha_twin_kv_heads": heads,
        "mha_twin_max_abs_logit_diff": (twin_logits - reference).abs().max().item(),
        "pooled_back_weights_identical": weights_equal,
        "pooled_back_logits_identical": bool(torch.equal(pooled_logits, reference)),
        "pca_back_weights_identical": all(torch.equal(original[name], tensor)
                                          for name, tensor in merged.state_dict().items()),
        "pca_back_logits_identical": bool(torch.equal(merged_logits, reference)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", default="runs/gqa_quality")
    parser.add_argument("--kv-heads", type=int, default=1, help="target KV heads (1 = MQA)")
    parser.add_argument("--eval-sequences", type=int, default=16)
    parser.add_argument("--eval-seq-len", type=int, default=512)
    parser.add_argument("--calibration-tokens", type=int, default=DEFAULT_CALIBRATION_TOKENS,
                        help="pca: tokens of the training articles its second moments are measured on")
    parser.add_argument("--uptrain-tokens", type=int, default=32768, help="0: no uptraining")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS),
                        help="conversions to measure")
    parser.add_argument("--uptrain-from", nargs="+", choices=("mean", "pca"), default=["mean"],
                        help="which conversions to uptrain (each must be among --methods)")
    parser.add_argument("--seq-len", type=int, default=256, help="uptraining sequence length")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--trainable", default="all", choices=("all", "attention", "kv"),
                        help="parameters uptrained: all (as in the paper), attention projections, or k/v only")
    parser.add_argument("--control", action=argparse.BooleanOptionalAction, default=False,
                        help="also uptrain the unconverted model on the same budget")
    parser.add_argument("--attn-implementation", default=ATTN_NAME)
    parser.add_argument("--source", default="wiki", choices=text_data.SOURCES)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.uptrain_tokens > 0 and not set(args.uptrain_from) <= set(args.methods):
        parser.error(f"--uptrain-from {' '.join(args.uptrain_from)} needs those among "
                     f"--methods {' '.join(args.methods)}")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    torch.manual_seed(args.seed)
    attn = resolve_attn_implementation(args.attn_implementation)
    model, tokenizer = load_model_and_tokenizer(None, attn_implementation=attn)
    files = text_data.write_text_corpus(out / "text", source=args.source)
    splits = text_data.load_text_splits(str(files["train"]), eval_data=str(files["eval"]))
    eval_rows = text_data.pack_fixed_length(text_data.tokenize_documents(splits["eval"], tokenizer),
                                            args.eval_seq_len, max_sequences=args.eval_sequences)
    eval_loader = _rows_loader(eval_rows, batch_size=4)
    eval_tokens = len(eval_rows) * (args.eval_seq_len - 1)
    results = {"model": "SmolLM2-135M-Instruct", "attn_implementation": attn, "eval_tokens": eval_tokens,
               "eval_sequences": len(eval_rows), "eval_seq_len": args.eval_seq_len,
               "kv_heads_before": model.config.num_key_value_heads, "kv_heads_after": args.kv_heads, "rows": []}
    calibration, calibration_data = calibration_ids(tokenizer, tokens=args.calibration_tokens,
                                                    cache_dir=out / "text", source=args.source)  # train split only
    results["calibration"] = {"data": calibration_data, "tokens": int(calibration.numel())}
    results["exactness"] = _exactness(model, torch.tensor(eval_rows[:1]["input_ids"]), calibration[:4])
    print(json.dumps(results["exactness"]))

    def measure(label, candidate, **extra):
        ppl = evaluate_perplexity(candidate, eval_loader)
        results["rows"].append({"model": label, "kv_heads": candidate.config.num_key_value_heads,
                                "perplexity": ppl, **extra})
        print(f"{label}: perplexity {ppl:.3f}", flush=True)
        return ppl

    measure("original", model)
    for method in args.methods:
        started_method = time.perf_counter()
        converted, report = convert_to_gqa(copy.deepcopy(model), args.kv_heads, method=method, seed=args.seed,
                                           return_report=True, calibration_ids=calibration)
        seconds = round(time.perf_counter() - started_method, 1)
        results["kv_cache_reduction"] = report.kv_cache_reduction
        measure(LABELS[method], converted, method=method, convert_seconds=seconds)
        if method in args.uptrain_from and args.uptrain_tokens > 0:
            converted.save_pretrained(out / f"{method}_converted")
            tokenizer.save_pretrained(out / f"{method}_converted")
        del converted

    budgets = [(m, out / f"{m}_converted") for m in args.methods if m in args.uptrain_from]
    budgets += [("original", None)] if args.control else []
    for label, source in budgets if args.uptrain_tokens > 0 else []:
        if source is None:
            model.save_pretrained(out / "original")
            tokenizer.save_pretrained(out / "original")
            source = out / "original"
        run = TrainArgs(model=str(source), output_dir=str(out / f"uptrain_{label}"), data=str(files["train"]),
                        eval_data=str(files["eval"]), attn_implementation=attn, packing="fixed",
                        seq_len=args.seq_len, batch_size=args.batch_size, lr=args.lr, warmup_steps=args.warmup_steps,
                        trainable=args.trainable,
                        token_budget=args.uptrain_tokens, eval_every=0, eval_sequences=1, save_every=0,
                        resume=False, seed=args.seed)
        report = train(run)
        uptrained, _ = load_model_and_tokenizer(str(out / f"uptrain_{label}" / "final"), attn_implementation=attn)
        name = f"{LABELS[label]} + uptrained" if label in LABELS else "original + uptrained (control)"
        measure(name, uptrained, uptrain_tokens=report["tokens"], uptrain_steps=report["steps"],
                uptrain_seconds=report["train_seconds"], trainable=args.trainable, lr=args.lr,
                first_loss=report["first_loss"],
                last_loss=report["last_loss"])
        del uptrained

    results["seconds"] = round(time.perf_counter() - started, 1)
    table = render_table(results)
    (out / "table.md").write_text(table)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(table)
    return 0


LABELS = {"pca": "pca-merged", "mean": "mean-pooled", "first": "first-pooled", "random": "random-pooled"}


def render_table(results: dict) -> str:
    baseline = results["rows"][0]["perplexity"]
    lines = [
        f"SmolLM2-135M, {results['kv_heads_before']} -> {results['kv_heads_after']} KV heads "
        f"(KV cache x{results['kv_cache_reduction']:g} smaller); held-out Wikipedia perplexity over "
        f"{results['eval_tokens']:,} predicted tokens ({results['eval_sequences']} x {results['eval_seq_len']}), "
        f"attention backend `{results['attn_implementation']}`; pca calibrated on "
        f"{results['calibration']['tokens']:,} tokens of {results['calibration']['data']}.",
        "",
        "| model | KV heads | uptraining tokens | perplexity | vs original |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for row in results["rows"]:
        tokens = f"{row['uptrain_tokens']:,}" if "uptrain_tokens" in row else "0"
        lines.append(f"| {row['model']} | {row['kv_heads']} | {tokens} | {row['perplexity']:.2f} | "
                     f"x{row['perplexity'] / baseline:.2f} |")
    exact = results["exactness"]
    lines += ["", f"Exactness: MHA twin ({exact['mha_twin_kv_heads']} KV heads) max |logit diff| "
                  f"{exact['mha_twin_max_abs_logit_diff']:.2e}; pooled back: weights identical "
                  f"{exact['pooled_back_weights_identical']}, "
                  f"logits identical {exact['pooled_back_logits_identical']}; "
                  f"merged back with pca: weights identical {exact['pca_back_weights_identical']}, "
                  f"logits identical {exact['pca_back_logits_identical']}."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
