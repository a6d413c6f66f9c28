#!/bin/bash
# Call 2 without the profiled fine-tune step, for a session whose refused starts left about 500 s of device time:
# the whole GPU grid, then two A/B rounds of the forward kernel time (d128 2k / 4k / 16k, d64 2k / 4k, 192/128).
# About 330 s of command. Carry .whl and ab.
# The tree: main with tag s58-held-reference-rounding-draft's cuda/ and hf_flashpatch/kernels/ checked out.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
bash scripts/gpu_grid.sh $OUT 180 > $OUT/grid.log 2>&1; tail -8 $OUT/grid.log
grep -h "kernel error\|^FAILED" $OUT/grid.log | head -5
echo "grid $(( $(date +%s) - START )) s"
timeout $(( 330 - ($(date +%s) - START) )) python3 scripts/ab_kernels.py --tree main=ab/main --tree held=. --rounds 2 \
  --only "^fwd (d128 (8x2k|4x4k) (full|causal)|d128 1x16k full|d64 (4x4k|8x2k) (full|causal)|d192/128 4x4k causal)$" \
  > $OUT/ab.log 2>&1
grep -A10 "after round 1 of" $OUT/ab.log | grep graph
grep -A20 "after round 2 of" $OUT/ab.log
echo "total $(( $(date +%s) - START )) s"
