"""Long-context fine-tuning: whole documents packed into long rows, no padding, no N x N mask.

Each step's batch is one row of up to ``--seq-len`` tokens holding several documents, built by
transformers' ``DataCollatorWithFlattening`` (position ids restart per document and ``cu_seq_lens``
mark the boundaries, so the attention backend keeps documents apart without a mask). Gradient
checkpointing is on by default. The report gives tokens/s and peak memory (CUDA allocator peak on
GPU, process peak RSS on CPU).

    python scripts/finetune_long.py --model ./ckpt --output-dir runs/long --seq-len 16384 --max-steps 200
    accelerate launch --config_file configs/accelerate_fsdp.yaml --num_processes 8 scripts/finetune_long.py ...
"""

from __future__ import annotations

import argparse
import json
import sys

from accelerate import PartialState

from hf_flashpatch.training import (INTERRUPTED, TrainArgs, TrainingInputError, TrainingOutputError, add_train_arguments,
                                    train)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    own_use = {"packing": "flatten only: whole documents per row (DataCollatorWithFlattening)",
               "batch_size": "not used: each step's micro-batch is one row of whole documents, --seq-len tokens"}
    add_train_arguments(parser, help_overrides=own_use, packing="flatten", seq_len=8192, gradient_checkpointing=True,
                        lr=2e-5, eval_every=0, save_every=50, eval_seq_len=2048)
    args = TrainArgs(**vars(parser.parse_args(argv)))
    if args.packing != "flatten":
        parser.error(f"finetune_long.py packs with DataCollatorWithFlattening; got --packing {args.packing}")
    try:
        report = train(args)
    except (TrainingInputError, TrainingOutputError) as error:  # a wrong argument, model, data file or resume, or
        # an output folder that cannot be written: one line, no traceback
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    status = INTERRUPTED if report["interrupted"] else 0  # a stopped run is not a finished one (no final/)
    if not PartialState().is_main_process:
        return status
    summary = {k: v for k, v in report.items() if k != "losses"}
    print(json.dumps(summary, indent=1))
    gib = report["peak_memory_bytes"] / 2**30
    print(f"throughput {report['tokens_per_s']:.1f} tokens/s, peak memory {gib:.2f} GiB, "
          f"{report['tokens']:,} tokens in {report['train_seconds']:.1f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
