#!/bin/bash
# Session 55, call 6: main with carry landed (the working tree). Its chain, split-round and walk-form tests; the step
# timelines of carry (ab/tl_carry, instrument_ends.py: 1024 ring tiles and the walks' end marks for every CTA) at
# 8x2k, 4x4k and 2x8k full with their raw clocks, and main's before carry (ab/tl_main) at 8x2k; an A/B of main before
# carry (ab/main) against it at 8x2k and 2x8k full (the split round's build changed too); and the sustained d128 full
# forward rows at 2k, 4k and 8k. Carry .whl and ab.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
PYTHONPATH=/tmp/site:$PWD HF_FLASHPATCH_CACHE=/tmp/c_new timeout 150 python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_forward_chained_walk.py tests/gpu/test_forward_split_tail.py \
  tests/gpu/test_forward_walks.py > $OUT/tests_new.log 2>&1
echo "== tests new: $(grep -E 'passed|failed|error' $OUT/tests_new.log | tail -1)"
grep -hE "^(FAILED|ERROR)" $OUT/tests_new.log | head -8
TL=results/2026-12-06_chain-boundary-timeline/chain_timeline.py
for run in "tl_carry 2048" "tl_carry 4096" "tl_carry 8192" "tl_main 2048"; do
  set -- $run
  PYTHONPATH=/tmp/site HF_FLASHPATCH_CACHE=/tmp/c_$1 timeout 60 python3 $TL ab/$1 $2 $OUT/raw_$1_$2.npz \
    > $OUT/timeline_$1_$2.log 2>&1
  echo "== $1 $2"; tail -60 $OUT/timeline_$1_$2.log | grep -vE "^ +([4-9]|1[0-1]|1[3-9]|2[0-4]|[3-4][0-9]) "
done
echo "timelines $(( $(date +%s) - START )) s"
PYTHONPATH=/tmp/site:$PWD timeout 150 python3 scripts/ab_kernels.py --tree main=ab/main --tree carry=. --rounds 6 \
  --only "^fwd d128 (8x2k|2x8k) full$" > $OUT/ab.log 2>&1
grep -A5 "after round" $OUT/ab.log | tail -6
PYTHONPATH=/tmp/site:$PWD timeout 90 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 \
  --seqlens 2048 4096 8192 --head-dims 128 --masks full --parts forward > $OUT/bench_sustained.log 2>&1
tail -8 $OUT/bench_sustained.log
echo "total $(( $(date +%s) - START )) s"
