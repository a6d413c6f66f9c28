#!/bin/bash
# Session 55, call 1 of this folder (main with carry): the whole GPU grid; issue 14's sustained table (d128 and d64,
# 2k / 4k / 8k / 16k, both masks, forward and backward); an A/B of the split last round at 4x4k full (ab/split4k: the
# split chain from 2049 keys). The fine-tune is left out (causal: carry did not change its kernels). Carry .whl and ab.
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
LEFT=$(( 450 - ($(date +%s) - START) ))
if [ $LEFT -gt 60 ]; then
  timeout $(( LEFT > 90 ? 90 : LEFT )) python3 scripts/ab_kernels.py --tree main=. --tree split4k=ab/split4k \
    --rounds 4 --only "^fwd d128 4x4k full$" > $OUT/ab_split4k.log 2>&1
  grep -A3 "after round" $OUT/ab_split4k.log | tail -4
fi
echo "total $(( $(date +%s) - START )) s"
