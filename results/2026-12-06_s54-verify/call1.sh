#!/bin/bash
# For the next session (not run in session 53: its device time was spent): the whole GPU grid on main with the listed
# walk, then issue 14's sustained table (d128 and d64, 2k and 16k, both masks, forward and backward), then the
# 16-layer fine-tune at one 16k sequence while the call's time allows. Prediction: the causal forward cells within
# their spread of call 4 (d128 1.026 / 1.155, d64 1.060 / 1.178 at 2k / 16k), the others within that of
# results/2026-12-06_split-tail call 4 and results/2026-12-06_q-boxes-final-table. About 560 s. Carry .whl.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
bash scripts/gpu_grid.sh $OUT 200 > $OUT/grid.log 2>&1; tail -12 $OUT/grid.log
T0=$(date +%s)
timeout 170 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 > $OUT/bench_sustained.log 2>&1
grep -E "forward|backward" $OUT/bench_sustained.log
echo "sustained $(( $(date +%s) - T0 )) s"
LEFT=$(( 560 - ($(date +%s) - START) ))
if [ $LEFT -gt 100 ]; then
  HF_FLASHPATCH_CACHE=/tmp/cA timeout $LEFT python3 scripts/bench_backward.py --only training > $OUT/bench_training16.log 2>&1
  grep -E '^(series|sdpa|hfpatch)' $OUT/bench_training16.log
else
  echo "training not run: $LEFT s left"
fi
echo "total $(( $(date +%s) - START )) s"
