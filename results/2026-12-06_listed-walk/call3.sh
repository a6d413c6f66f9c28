#!/bin/bash
# Session 53, call 3 (PREDICTION.md): the listed walk's two forms against main. ab/greedy = call 1's tree (the
# pair-major order dealt out by the host, tail sorted; tag s53-greedy-listed-walk-draft, decision at 0.99); the work
# tree = the snake walk with its last rounds dealt out again. The walks' GPU tests first. Carry .whl and ab.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
HF_FLASHPATCH_CACHE=/tmp/ct timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_forward_walks.py \
  > $OUT/tests.log 2>&1
echo "== tests: $(grep -E 'passed|failed|error' $OUT/tests.log | tail -1)"
grep -E "^(FAILED|ERROR)|Error" $OUT/tests.log | head -8
echo "tests $(( $(date +%s) - START )) s"
timeout 300 python3 scripts/ab_kernels.py --tree main=ab/main --tree greedy=ab/greedy --tree tailed=. --rounds 3 \
  --only "^fwd (d128 (8x2k|4x4k|2x8k)|d64 (8x2k|4x4k)) causal$" > $OUT/ab_listed.log 2>&1
grep -A11 "after round 3" $OUT/ab_listed.log || grep -A11 "after round 2" $OUT/ab_listed.log || tail -5 $OUT/ab_listed.log
echo "total $(( $(date +%s) - START )) s"
