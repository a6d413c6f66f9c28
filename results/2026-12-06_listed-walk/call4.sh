#!/bin/bash
# Session 53, call 4 (PREDICTION.md): the final tree. The forward GPU tests (the grid's forward group, the walks'
# tests with it), kernel time against main where the sections move (the listed form weighs each section), then the
# sustained causal forward rows against cuDNN. Carry .whl and ab. At most about 420 s.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
HF_FLASHPATCH_CACHE=/tmp/ct timeout 160 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_forward.py \
  tests/gpu/test_forward_walks.py > $OUT/tests.log 2>&1
echo "== tests: $(grep -E 'passed|failed|error' $OUT/tests.log | tail -1)"
grep -E "^(FAILED|ERROR)|Error" $OUT/tests.log | head -8
echo "tests $(( $(date +%s) - START )) s"
timeout 150 python3 scripts/ab_kernels.py --tree main=ab/main --tree listed=. --rounds 3 \
  --only "^fwd (d128 4x4k causal|d64 (8x2k|4x4k|1x16k) causal|d64 4x4k causal gqa4)$" > $OUT/ab_listed.log 2>&1
grep -A12 "after round 3" $OUT/ab_listed.log | grep -E "case|graph" || grep -A12 "after round 2" $OUT/ab_listed.log \
  | grep -E "case|graph" || tail -5 $OUT/ab_listed.log
echo "ab $(( $(date +%s) - START )) s"
LEFT=$(( 420 - ($(date +%s) - START) ))
timeout $LEFT python3 scripts/bench_sustained.py --seconds 0.5 --rounds 5 --seqlens 2048 4096 8192 16384 \
  --head-dims 64 128 --masks causal --parts forward > $OUT/bench_sustained.log 2>&1
grep -E "forward" $OUT/bench_sustained.log
echo "total $(( $(date +%s) - START )) s"
