#!/bin/bash
# Session 56: the work-by-work key loop takes its Q descriptor opaque (derived where used: SteppedDescriptor::opaque)
# against main (ab/main). The whole GPU grid on the working tree, then an A/B of every build whose SASS changed
# (d64 full and causal, masked d128 of both Q forms, the unmasked non-chained d128 at 16k, 192/128) with the chained
# 8x2k full (same SASS) as a control. Carry .whl and ab.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
bash scripts/gpu_grid.sh $OUT 200 > $OUT/grid.log 2>&1; tail -9 $OUT/grid.log
echo "grid done at $(( $(date +%s) - START )) s"
timeout 330 python3 scripts/ab_kernels.py --tree main=ab/main --tree opaque=. --rounds 3 \
  --only "^fwd d64 (4x4k (full|causal)|8x2k causal)$|^fwd d128 (4x4k causal|8x2k (full|causal)|1x16k (full|causal))$|^fwd d192/128" > $OUT/ab.log 2>&1
grep -A12 "after round 3" $OUT/ab.log | tail -13
echo "total $(( $(date +%s) - START )) s"
