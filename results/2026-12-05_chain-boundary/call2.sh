#!/bin/bash
# session 47, call 2: the chained walk's step timeline at 8x2k (main 7e3f588 + chain_timeline.diff in ab_tl, carried).
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
timeout 120 python3 results/2026-12-05_chain-boundary/chain_timeline.py ab_tl > $OUT/chain_timeline.log 2>&1; cat $OUT/chain_timeline.log | tail -25
echo "total $(( $(date +%s) - START )) s"
