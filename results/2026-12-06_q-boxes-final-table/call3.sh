#!/bin/bash
# Session 51, call 3: issue 14's sustained table at the lengths between its endpoints (4k and 8k, 16k tokens a batch),
# main with the chain's Q boxes. Carry .whl.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 --seqlens 4096 8192 > $OUT/bench_sustained_4k_8k.log 2>&1
grep -E "forward|backward" $OUT/bench_sustained_4k_8k.log
echo "total $(( $(date +%s) - START )) s"
