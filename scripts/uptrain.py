"""Uptrain a checkpoint, typically one just converted to GQA/MQA (Ainslie et al. 2023 use 5% of pre-training).

    # one process (CPU or one GPU)
    python scripts/uptrain.py --model ./smollm2-mqa --output-dir runs/mqa --token-budget 2e6
    # convert on the fly, then uptrain
    python scripts/uptrain.py --model smollm2 --kv-heads 1 --output-dir runs/mqa --token-budget 2e6
    # N GPUs, DDP or FSDP (configs/accelerate_{ddp,fsdp}.yaml)
    accelerate launch --config_file configs/accelerate_ddp.yaml --num_processes 8 scripts/uptrain.py ...
    # the budget as a fraction of pre-training
    ... --token-fraction 0.05 --pretrain-tokens 2e12

Rerunning the same command after an interrupt (Ctrl-C, SIGTERM, a crash or kill, even mid-save) resumes
from the last complete checkpoint in OUTPUT with nothing lost; ``--no-resume`` starts over. A resume
with another ``--seq-len``, ``--batch-size``, ``--grad-accum`` or ``--seed`` is refused. The attention
backend defaults to the plugin's (``hf_flashpatch.ATTN_NAME``: CUDA kernels on GPU, torch fallback on
CPU).
"""

from __future__ import annotations

import argparse
import json
import sys

from accelerate import PartialState

from hf_flashpatch.training import TrainArgs, TrainingInputError, add_train_arguments, train


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_train_arguments(parser, packing="fixed", seq_len=512, eval_every=50, save_every=100)
    args = TrainArgs(**vars(parser.parse_args(argv)))
    try:
        report = train(args)
    except TrainingInputError as error:  # a wrong argument, model, data file or resume: one line, no traceback
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    if not PartialState().is_main_process:
        return 0
    summary = {k: v for k, v in report.items() if k != "losses"}
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
