#!/bin/bash
# Session 52, call 5 (the device time left: about 180 s of command): the split round with its parameters last in
# FwdParams (the branch's head; every other forward build's SASS is main's): the split's and the chain's GPU tests,
# then kernel time against main (two rounds, no A/A: calls 1-2 read A/A at 0.981-1.007). Carry .whl and ab
# (ab/ab_main52 = main, ab/ab_endD = the head).
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
HF_FLASHPATCH_CACHE=/tmp/ct timeout 75 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_forward_split_tail.py \
  tests/gpu/test_forward_chained_walk.py > $OUT/tests.log 2>&1
echo "== tests: $(grep -E 'passed|failed|error' $OUT/tests.log | tail -1)"
grep -E "^(FAILED|ERROR)|Error" $OUT/tests.log | head -8
echo "tests $(( $(date +%s) - START )) s"
timeout 95 python3 scripts/ab_kernels.py --tree main=ab/ab_main52 --tree split=ab/ab_endD --rounds 2 \
  --only "^fwd d128 (8x2k|4x4k|2x8k) full$" > $OUT/ab_split.log 2>&1
grep -A8 "after round 2" $OUT/ab_split.log || grep -A8 "after round 1" $OUT/ab_split.log || tail -5 $OUT/ab_split.log
echo "total $(( $(date +%s) - START )) s"
