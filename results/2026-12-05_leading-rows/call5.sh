#!/bin/bash
# session 45: A/B of kernel time, the exact correction (this tree, 737502b) against f20fa64. Before the call:
# mkdir ab_base && git archive f20fa64 cuda hf_flashpatch scripts | tar x -C ab_base   (untracked, so it is carried)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
timeout 330 python3 scripts/ab_kernels.py --tree base=ab_base --tree exact=. --rounds 3 --only "^fwd d(128|64) (8x2k|4x4k|1x16k) (full|causal)$|^fwd d192" > $OUT/ab_exact_correction.log 2>&1
tail -30 $OUT/ab_exact_correction.log
