#!/bin/bash
# Session 54, call 2 (PREDICTION.md): the chained walk's boundary without its divisions. ab/main and ab/main2 = HEAD
# (A/A), ab/carry = tiles carried, the work tree = carried + the round cursor. The chain's GPU tests on the work
# tree, the A/B (unmasked d128), then the sustained d128 full rows at 2k and 4k. Carry .whl and ab.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
HF_FLASHPATCH_CACHE=/tmp/ct timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_forward_chained_walk.py \
  tests/gpu/test_forward_split_tail.py > $OUT/tests.log 2>&1
echo "== tests: $(grep -E 'passed|failed|error' $OUT/tests.log | tail -1)"
grep -E "^(FAILED|ERROR)|Error" $OUT/tests.log | head -8
echo "tests $(( $(date +%s) - START )) s"
timeout 300 python3 scripts/ab_kernels.py --tree main=ab/main --tree main2=ab/main2 --tree carry=ab/carry \
  --tree cursor=. --rounds 3 --only "^fwd d128 (8x2k|4x4k|2x8k|1x16k) full$" > $OUT/ab.log 2>&1
grep -A9 "after round 3" $OUT/ab.log || grep -A9 "after round 2" $OUT/ab.log || tail -5 $OUT/ab.log
echo "ab $(( $(date +%s) - START )) s"
T0=$(date +%s)
timeout 100 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 --seqlens 2048 4096 --head-dims 128 \
  --masks full --parts forward > $OUT/bench_sustained.log 2>&1
grep -E "forward" $OUT/bench_sustained.log
echo "total $(( $(date +%s) - START )) s"
