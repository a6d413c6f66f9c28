#!/bin/bash
# Session 55: the split last round's pieces as a kernel of their own (the working tree) against main before it
# (ab/main). GPU tests of the chain, the split round and the walk forms; an A/B at 4x4k (the split now serves there),
# 2x8k (split on both sides; the full rounds' SASS now the chain's without the split) and 8x2k full (no split: the
# same SASS, a control); the sustained d128 full forward rows. Carry .whl and ab.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
HF_FLASHPATCH_CACHE=/tmp/c_new timeout 150 python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_forward_chained_walk.py tests/gpu/test_forward_split_tail.py \
  tests/gpu/test_forward_walks.py > $OUT/tests_new.log 2>&1
echo "== tests new: $(grep -E 'passed|failed|error' $OUT/tests_new.log | tail -1)"
grep -hE "^(FAILED|ERROR)" $OUT/tests_new.log | head -8
timeout 200 python3 scripts/ab_kernels.py --tree main=ab/main --tree pieces=. --rounds 6 \
  --only "^fwd d128 (4x4k|2x8k|8x2k) full$" > $OUT/ab.log 2>&1
grep -A7 "after round" $OUT/ab.log | tail -8
timeout 90 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 \
  --seqlens 2048 4096 8192 --head-dims 128 --masks full --parts forward > $OUT/bench_sustained.log 2>&1
tail -4 $OUT/bench_sustained.log
echo "total $(( $(date +%s) - START )) s"
