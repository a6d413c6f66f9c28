#!/bin/bash
# Call 1 (any card): which form should a d128 causal walk of 2k-8k keys take? Kernel time in CUDA graphs, five
# rounds, main (the walk: Q by the TMA, output boxes in the last K slot) against the walk with the math warps copying
# Q (ab/copiedq) and one CTA per work tile (ab/pertile), then the sustained causal rows of the winner if one gains.
# Before the call: `bash results/2026-12-07_masked-walk-forms-8k/make_trees.sh`. Carry .whl and ab.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
timeout 420 python3 scripts/ab_kernels.py --tree main=ab/main --tree copiedq=ab/copiedq --tree pertile=ab/pertile \
  --rounds 5 --only 'fwd d128 (8x2k|4x4k|2x8k|1x16k) causal$|fwd d128 8x2k full' > $OUT/ab.log 2>&1
grep -A12 "after round 5" $OUT/ab.log | grep -E "case|graph"
echo "total $(( $(date +%s) - START )) s"
