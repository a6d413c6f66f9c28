#!/bin/bash
# Session 55, call 2: the pieces' kernel launched beside the full rounds' (a side stream each, forked from torch's
# stream: its CTAs take SMs as the full rounds' CTAs free them, with no launch between; the working tree) against
# ac65219 (ab/main, one launch after the other). GPU tests of the chain, the split round and the walk forms; an A/B
# at 4x4k and 2x8k full (six rounds; CUDA graphs and eager); the sustained d128 full forward at 4k and 8k.
# Carry .whl and ab.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
HF_FLASHPATCH_CACHE=/tmp/c_new timeout 120 python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_forward_chained_walk.py tests/gpu/test_forward_split_tail.py \
  tests/gpu/test_forward_walks.py > $OUT/tests_new.log 2>&1
echo "== tests new: $(grep -E 'passed|failed|error' $OUT/tests_new.log | tail -1)"
grep -hE "^(FAILED|ERROR)" $OUT/tests_new.log | head -8
timeout 150 python3 scripts/ab_kernels.py --tree main=ab/main --tree beside=. --rounds 6 \
  --only "^fwd d128 (4x4k|2x8k) full$" > $OUT/ab.log 2>&1
grep -A5 "after round" $OUT/ab.log | tail -6
timeout 50 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 \
  --seqlens 4096 8192 --head-dims 128 --masks full --parts forward > $OUT/bench_sustained.log 2>&1
tail -3 $OUT/bench_sustained.log
echo "total $(( $(date +%s) - START )) s"
