#!/bin/bash
# Call 1 (session 64): issue 14's whole attention table, sustained, ours / cuDNN, on the committed tree (the first
# H200 reading of the dealt d64 walk), after the forward walks' GPU tests on the review commit's host tables.
# Usage: bash call1.sh. Carry .whl. Any card: say which one ran it.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
git log -1 --format=%h 2>/dev/null
HF_FLASHPATCH_CACHE=/tmp/cW timeout 150 python3 -m pytest -q -x tests/gpu/test_forward_walks.py > $OUT/walks.log 2>&1
tail -1 $OUT/walks.log
echo "walks $(( $(date +%s) - START )) s"
timeout 210 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 --seqlens 2048 4096 8192 16384 \
  --head-dims 128 > $OUT/sustained_d128.log 2>&1
timeout 210 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 --seqlens 2048 4096 8192 16384 \
  --head-dims 64 > $OUT/sustained_d64.log 2>&1
grep -hE "forward|backward" $OUT/sustained_d128.log $OUT/sustained_d64.log
echo "total $(( $(date +%s) - START )) s"
