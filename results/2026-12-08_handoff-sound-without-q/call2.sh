#!/bin/bash
# The call as run (call1.sh cut to the session's last device time): kernel time of main (316293a) and the change (A/B,
# CUDA graphs, two rounds), then the grid's forward group only (tests/gpu/test_forward.py, test_forward_walks.py: the
# masked d128 walks, the group-3 walk without Q boxes and the unmappable q among them) on the checkout. Set up ab/ as
# call1.sh says; carry .whl and ab.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
timeout 55 python3 scripts/ab_kernels.py --tree main=ab/main --tree sound=ab/sound --rounds 2 \
  --only 'fwd d128 (8x2k|4x4k|2x8k) causal$|fwd d128 8x2k full' > $OUT/ab.log 2>&1
grep -A9 "after round" $OUT/ab.log | grep -E "after|case|graph" | tail -6
echo "ab $(( $(date +%s) - START )) s"
HF_FLASHPATCH_CACHE=/tmp/cF timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/gpu/test_forward.py tests/gpu/test_forward_walks.py > $OUT/forward_tests.log 2>&1
echo "rc=$?" >> $OUT/forward_tests.log
tail -2 $OUT/forward_tests.log; grep -E "^(FAILED|ERROR)" $OUT/forward_tests.log | head
echo "total $(( $(date +%s) - START )) s"
