#!/bin/bash
# Call 6 (an H200, the issue's card, if one starts): issue 14's forward rows against cuDNN, sustained, on the
# committed tree. Carry .whl.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
git log -1 --format=%h 2>/dev/null
timeout 330 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 --seqlens 2048 4096 8192 16384 \
  --parts forward > $OUT/sustained.log 2>&1
grep -E "forward" $OUT/sustained.log
echo "total $(( $(date +%s) - START )) s"
