#!/bin/bash
# Session 52, call 3: the split last round (branch split-tail-draft, the working tree): its GPU tests and the chain's
# and walks', then the A/B of kernel time against main with an A/A control and the draft with the split off.
# Prediction in PREDICTION.md. Carry .whl and ab (ab/ab_main52 = main, ab/ab_split = the draft, ab/ab_split_off = the
# draft with split_tail=False on the unmasked d128 shape).
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
HF_FLASHPATCH_CACHE=/tmp/ct timeout 230 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_forward_split_tail.py \
  tests/gpu/test_forward_chained_walk.py tests/gpu/test_forward_walks.py > $OUT/tests.log 2>&1
echo "== tests: $(grep -E 'passed|failed|error' $OUT/tests.log | tail -1)"
grep -E "^(FAILED|ERROR)|Error" $OUT/tests.log | head -8
echo "tests $(( $(date +%s) - START )) s"
timeout 250 python3 scripts/ab_kernels.py --tree main=ab/ab_main52 --tree split=ab/ab_split \
  --tree main_again=ab/ab_main52 --tree split_off=ab/ab_split_off --rounds 3 \
  --only "^fwd d128 (8x2k|4x4k|2x8k) full$" > $OUT/ab_split.log 2>&1
grep -A8 "after round 3" $OUT/ab_split.log || tail -20 $OUT/ab_split.log
echo "total $(( $(date +%s) - START )) s"
