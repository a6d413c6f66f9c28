#!/bin/bash
# Session 52, call 2: what the last round of works costs (probe.py, prediction in PREDICTION.md), then issue 14's
# sustained d128 rows at 2k-16k on main with the chained step computed ahead. Carry .whl.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 results/2026-12-06_round-quantization/probe.py > $OUT/probe.log 2>&1
cat $OUT/probe.log
echo "probe $(( $(date +%s) - START )) s"
timeout 300 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 --seqlens 2048 4096 8192 16384 \
  --head-dims 128 > $OUT/bench_sustained_d128.log 2>&1
grep -E "forward|backward" $OUT/bench_sustained_d128.log
echo "total $(( $(date +%s) - START )) s"
