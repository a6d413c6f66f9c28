#!/bin/bash
# Session 53, call 2: the listed masked walk with works weighing their key tiles + 3 (PREDICTION.md). The walks'
# GPU tests, kernel time against main (an A/A pair of main's tree beside it), then the sustained causal forward rows
# against cuDNN. Carry .whl and ab
# (ab/main = main at the commit before the list).
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
HF_FLASHPATCH_CACHE=/tmp/ct timeout 170 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_forward_walks.py \
  > $OUT/tests.log 2>&1
echo "== tests: $(grep -E 'passed|failed|error' $OUT/tests.log | tail -1)"
grep -E "^(FAILED|ERROR)|Error" $OUT/tests.log | head -8
echo "tests $(( $(date +%s) - START )) s"
timeout 230 python3 scripts/ab_kernels.py --tree main=ab/main --tree main2=ab/main --tree listed=. --rounds 3 \
  --only "^fwd (d128 (8x2k|4x4k|2x8k)|d64 8x2k) causal$" > $OUT/ab_listed.log 2>&1
grep -A9 "after round 3" $OUT/ab_listed.log || grep -A9 "after round 2" $OUT/ab_listed.log || tail -5 $OUT/ab_listed.log
echo "ab $(( $(date +%s) - START )) s"
LEFT=$(( 570 - ($(date +%s) - START) ))
timeout $LEFT python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 --seqlens 2048 4096 8192 --head-dims 128 64 \
  --masks causal --parts forward > $OUT/bench_sustained.log 2>&1
grep -E "forward" $OUT/bench_sustained.log
echo "total $(( $(date +%s) - START )) s"
