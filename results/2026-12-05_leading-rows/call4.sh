#!/bin/bash
# session 45: the online softmax's correction exact (1) where a tile moves no maximum (cuda/fwd_softmax.cuh), so a key
# tile a row cannot see changes none of its bits; then debug_window.py (every pair bit-identical now), the whole GPU
# grid, and the sustained table against cuDNN.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
timeout 120 python3 results/2026-12-05_leading-rows/debug_window.py > $OUT/debug_window.log 2>&1
grep -E "vs-" $OUT/debug_window.log | awk '{print $1, $2, $3, $4, $5, $6, $9, $10, $15, $16}'
bash scripts/gpu_grid.sh $OUT 170 > $OUT/grid.log 2>&1; tail -12 $OUT/grid.log
T0=$(date +%s)
timeout 140 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 > $OUT/bench_sustained.log 2>&1
grep -E "forward|backward" $OUT/bench_sustained.log
echo "sustained $(( $(date +%s) - T0 )) s, total $(( $(date +%s) - START )) s"
