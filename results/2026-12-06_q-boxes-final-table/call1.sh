#!/bin/bash
# Session 51: main with the chain's next Q by per-warp TMA boxes (merged from tag s50-chain-q-boxes-draft): the whole
# GPU grid, then issue 14's sustained table against cuDNN, then the 16-layer fine-tune at one 16k sequence while the
# call's time allows. Carry .whl (../shared/gpu/stage.sh).
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
  T0=$(date +%s)
  HF_FLASHPATCH_CACHE=/tmp/cA timeout $LEFT python3 scripts/bench_backward.py --only training > $OUT/bench_training16.log 2>&1
  grep -E '^(series|sdpa|hfpatch)' $OUT/bench_training16.log
  echo "training $(( $(date +%s) - T0 )) s"
else
  echo "training not run: $LEFT s left"
fi
echo "total $(( $(date +%s) - START )) s"
