#!/bin/bash
# Session 56: next_call.sh without the grid (the budget left after four refused starts; this session's call 1 ran the
# whole grid on a tree whose chained builds are main's, and every other build's SASS has passed the grid since
# session 54): issue 14's sustained table (d128 at 2k / 4k / 8k / 16k, d64 at 2k / 16k), then the 16-layer fine-tune while time allows.
# Usage: bash call_s56.sh [seconds for the whole call, default 420]. Carry .whl. Any card: say which one ran it.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
timeout 200 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 --seqlens 2048 4096 8192 16384 \
  --head-dims 128 > $OUT/bench_sustained.log 2>&1
timeout 110 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 --seqlens 2048 16384 \
  --head-dims 64 > $OUT/bench_sustained_d64.log 2>&1
grep -hE "forward|backward" $OUT/bench_sustained.log $OUT/bench_sustained_d64.log
echo "sustained $(( $(date +%s) - START )) s"
LEFT=$(( ${1:-420} - ($(date +%s) - START) ))
if [ $LEFT -gt 90 ]; then
  HF_FLASHPATCH_CACHE=/tmp/cA timeout $LEFT python3 scripts/bench_backward.py --only training > $OUT/bench_training16.log 2>&1
  grep -E '^(series|sdpa|hfpatch)' $OUT/bench_training16.log
else
  echo "training not run: $LEFT s left"
fi
echo "total $(( $(date +%s) - START )) s"
