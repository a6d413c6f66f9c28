#!/bin/bash
# For the next session (session 55's two attempts to start it were refused): the whole GPU grid on main (carry and the
# split's pieces as a kernel of their own), issue 14's sustained table (d128 and d64, 2k / 4k / 8k / 16k, both masks,
# forward and backward), then the 16-layer fine-tune at 4 x 4k and one 16k sequence while the call's time allows.
# About 560 s with the start. Carry .whl. Any card: say which one ran it.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
bash scripts/gpu_grid.sh $OUT 200 > $OUT/grid.log 2>&1; tail -12 $OUT/grid.log
T0=$(date +%s)
timeout 300 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 --seqlens 2048 4096 8192 16384 \
  > $OUT/bench_sustained.log 2>&1
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
