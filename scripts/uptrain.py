"""Uptrain a checkpoint, typically one just converted to GQA/MQA (Ainslie et al. 2023 use 5% of pre-training).

    # one process (CPU or one GPU)
    python scripts/uptrain.py --model ./smollm2-mqa --output-dir runs/mqa --token-budget 2e6
    # convert on the fly, then uptrain
    python scripts/uptrain.py --model smollm2 --kv-heads 1 --output-dir runs/mqa --token-budget 2e6
    # N GPUs, DDP or FSDP (configs/accelerate_{ddp,fsdp}.yaml)
    accelerate launch --config_file configs/accelerate_ddp.yaml --num_processes 8 scripts/uptrain.py ...
    # the budget as a fraction of pre-training
    ... --token-fraction 0.05 --pretrain-tokens 2e12
    # distil from the unconverted model (KL to its logits, computed on the fly), perplexity at chosen token counts
    python scripts/uptrain.py --model ./smollm2-mqa --teacher smollm2 --output-dir runs/mqa-kd \
        --data mix --token-budget 5e6 --eval-at-tokens 0,1e6,2e6,5e6 [--ce-weight 0.5]
    # the control: the unconverted model, cross-entropy, same data and schedule (the same command + --control)
    python scripts/uptrain.py --model ./smollm2-mqa --teacher smollm2 --output-dir runs/control --control ...

Rerunning the same command after an interrupt (Ctrl-C, SIGTERM, a crash or kill, even mid-save) resumes
from the last complete checkpoint in OUTPUT with nothing lost (dropout included: the same masks as an uninterrupted
run); ``OUTPUT/final`` and ``report.json`` are replaced whole, never half written; ``--no-resume`` starts over,
moving a previous run's ``final`` and ``report.json`` to ``OUTPUT/previous_run``. A full disk is one line naming
the path (exit status 2), the last complete checkpoint kept. An interrupted
run exits with status 130 after its checkpoint (a finished one with 0). A resume with another ``--seq-len``,
``--batch-size``, ``--grad-accum``, ``--seed``, ``--data``, ``--source`` or ``--max-train-docs`` is refused, and
so is one with another ``--teacher`` (the teacher is not saved in the checkpoint, only named, and reloaded),
``--control``, ``--ce-weight``, ``--distill-temperature``, ``--kv-heads``, ``--trainable``, ``--lr`` or
``--weight-decay`` (the optimizer state would override the last two silently). The attention backend defaults to the plugin's
(``hf_flashpatch.ATTN_NAME``: CUDA kernels on GPU, torch fallback on CPU). Held-out perplexity
measurements go to ``OUTPUT/eval_log.json`` as they are made (the recovery curve), the whole report to
``OUTPUT/report.json``.
"""

from __future__ import annotations

import argparse
import json
import sys

from accelerate import PartialState

from hf_flashpatch.cli import ArgumentParser
from hf_flashpatch.training import (INTERRUPTED, TrainArgs, TrainingInputError, TrainingOutputError, add_train_arguments,
                                    train)


def main(argv: list[str] | None = None) -> int:
    # A bad flag is one line on stderr and exit status 2 (no usage block burying it).
    parser = ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_train_arguments(parser, packing="fixed", seq_len=512, eval_every=50, save_every=100)
    args = TrainArgs(**vars(parser.parse_args(argv)))
    try:
        report = train(args)
    except (TrainingInputError, TrainingOutputError) as error:  # a wrong argument, model, data file or resume, or
        # an output folder that cannot be written: one line, no traceback
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    status = INTERRUPTED if report["interrupted"] else 0  # a stopped run is not a finished one (no final/)
    if not PartialState().is_main_process:
        return status
    summary = {k: v for k, v in report.items() if k not in ("losses", "loss_parts")}
    print(json.dumps(summary, indent=1))
    return status


if __name__ == "__main__":
    sys.exit(main())
