#!/bin/bash
# Session 55, call 2: the pieces' kernel launched beside the full rounds' (a side stream each, forked from torch's
# stream: its CTAs take SMs as the full rounds' CTAs free them, with no launch between; the working tree) against
# ac65219 (ab/main, one launch after the other). The split round's GPU tests; an A/B at 4x4k and 2x8k full (four
# rounds; CUDA graphs and eager): what 357 s of device time left allow. Carry .whl and ab.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
HF_FLASHPATCH_CACHE=/tmp/c_new timeout 60 python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_forward_split_tail.py > $OUT/tests_new.log 2>&1
echo "== tests new: $(grep -E 'passed|failed|error' $OUT/tests_new.log | tail -1)"
grep -hE "^(FAILED|ERROR)" $OUT/tests_new.log | head -8
timeout 150 python3 scripts/ab_kernels.py --tree main=ab/main --tree beside=. --rounds 4 \
  --only "^fwd d128 (4x4k|2x8k) full$" > $OUT/ab.log 2>&1
grep -A5 "after round" $OUT/ab.log | tail -6
echo "total $(( $(date +%s) - START )) s"
