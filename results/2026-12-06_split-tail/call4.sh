#!/bin/bash
# Run in session 53 (call 4): whole GPU grid on main with the split
# chain (the split's tests run with the chain's), then issue 14's sustained d128 rows at 2k-16k. Prediction: the 8k
# full cell 1.05-1.07 of cuDNN (1.037 in results/2026-12-06_round-quantization before the split, and the split chain
# at 0.979 of the work-by-work walk's kernel time at 2x8k); every other cell's SASS is unchanged, so within its
# spread of that table. About 450 s. Carry .whl.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
bash scripts/gpu_grid.sh $OUT 200 > $OUT/grid.log 2>&1; tail -12 $OUT/grid.log
echo "grid $(( $(date +%s) - START )) s"
LEFT=$(( 560 - ($(date +%s) - START) ))
timeout $LEFT python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 --seqlens 8192 2048 4096 16384 \
  --head-dims 128 > $OUT/bench_sustained_d128.log 2>&1
grep -E "forward|backward" $OUT/bench_sustained_d128.log
echo "total $(( $(date +%s) - START )) s"
