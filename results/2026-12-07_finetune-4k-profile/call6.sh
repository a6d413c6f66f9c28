#!/bin/bash
# Run on call 4's warm machine: the fine-tune rows, then tag s60-fence-finish-probe (ab/fence_finish) against main's
# kernels (ab/main) at three unmasked d128 cases, three rounds. Carry .whl and ab.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
START=$(date +%s)
timeout 100 python3 scripts/bench_backward.py --only training > $OUT/training.log 2>&1
grep -E '^(sdpa|hfpatch)' $OUT/training.log
echo "training $(( $(date +%s) - START )) s"
timeout $(( 250 - ($(date +%s) - START) )) python3 scripts/ab_kernels.py --tree main=ab/main --tree fence=ab/fence_finish \
  --rounds 3 --only "^fwd (d128 8x2k full|d128 4x4k full|d128 1x16k full)$" > $OUT/ab_fence.log 2>&1
grep -A5 "after round" $OUT/ab_fence.log | grep -E "round|graph"
echo "total $(( $(date +%s) - START )) s"
