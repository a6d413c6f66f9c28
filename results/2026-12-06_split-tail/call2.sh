#!/bin/bash
# Session 52, call 4: the split round's pieces as a second instance of the chained walk (the first keeps main's
# steady step): the split's and the chain's GPU tests (device time: not the walks'), then the A/B of kernel time against main with an
# A/A control (the split-off tree left out for device time). Carry .whl and ab (ab/ab_main52 = main, ab/ab_splitD =
# the draft).
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
HF_FLASHPATCH_CACHE=/tmp/ct timeout 130 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_forward_split_tail.py \
  tests/gpu/test_forward_chained_walk.py > $OUT/tests.log 2>&1
echo "== tests: $(grep -E 'passed|failed|error' $OUT/tests.log | tail -1)"
grep -E "^(FAILED|ERROR)|Error" $OUT/tests.log | head -8
echo "tests $(( $(date +%s) - START )) s"
timeout 160 python3 scripts/ab_kernels.py --tree main=ab/ab_main52 --tree split=ab/ab_splitD \
  --tree main_again=ab/ab_main52 --rounds 2 \
  --only "^fwd d128 (8x2k|4x4k|2x8k) full$" > $OUT/ab_split.log 2>&1
grep -A8 "after round 2" $OUT/ab_split.log || tail -20 $OUT/ab_split.log
echo "total $(( $(date +%s) - START )) s"
