#!/bin/bash
# Session 54, call 4 (call 3 never started: three refusals left about 340 s): main's chain and split-round GPU tests
# (with the new case of more query tiles a pair than CTAs), then the step timelines of main (8x2k and 4x4k full) and
# of carry (8x2k full). ab/tl_main, ab/tl_carry: the trees with instrument.py's clocks. Carry .whl and ab.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
PYTHONPATH=/tmp/site:$PWD HF_FLASHPATCH_CACHE=/tmp/c_main timeout 90 python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_forward_chained_walk.py tests/gpu/test_forward_split_tail.py > $OUT/tests_main.log 2>&1
echo "== tests main: $(grep -E 'passed|failed|error' $OUT/tests_main.log | tail -1)"
grep -hE "^(FAILED|ERROR)" $OUT/tests_main.log | head -8
echo "tests $(( $(date +%s) - START )) s"
for run in "tl_main 2048" "tl_carry 2048" "tl_main 4096"; do
  set -- $run
  PYTHONPATH=/tmp/site HF_FLASHPATCH_CACHE=/tmp/c_$1 timeout 45 python3 \
    results/2026-12-05_chain-boundary/chain_timeline.py ab/$1 $2 > $OUT/timeline_$1_$2.log 2>&1
  echo "== $1 $2"; tail -30 $OUT/timeline_$1_$2.log | grep -vE "^ +([4-9]|1[0-1]|1[3-9]|2[0-4]) "
done
echo "total $(( $(date +%s) - START )) s"
