#!/bin/bash
# Call 2 (any card; session 64's H200 requests were refused): the whole GPU grid on the committed tree (the review
# commit's host tables had not run on a GPU), then issue 14's forward rows, sustained, while time allows.
# Usage: bash call2.sh [seconds for the whole call, default 560]. Carry .whl.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
git log -1 --format=%h 2>/dev/null
bash scripts/gpu_grid.sh $OUT 200 > $OUT/grid.log 2>&1; tail -12 $OUT/grid.log
LEFT=$(( ${1:-560} - ($(date +%s) - START) ))
echo "grid done at $(( $(date +%s) - START )) s; $LEFT s left"
if [ $LEFT -gt 120 ]; then
  timeout $LEFT python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 --seqlens 2048 4096 \
    --head-dims 128 64 --parts forward > $OUT/sustained.log 2>&1
  grep -E "forward" $OUT/sustained.log
fi
echo "total $(( $(date +%s) - START )) s"
