#!/bin/bash
# The GPU grid with the eager training path landed in 06ccccd (tests/gpu/test_training.py and test_backward.py call
# the API with grad, so they now go through EagerAttentionAutograd), then the host time of a training call
# (scripts/profile_host.py --training) in the committed form. Carry .whl. About 300 s.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
git log -1 --format=%h 2>/dev/null
bash scripts/gpu_grid.sh $OUT 200 > $OUT/grid.log 2>&1; echo "grid rc $?"
cat $OUT/grid.log
export HF_FLASHPATCH_CACHE=/tmp/cA
timeout $(( 330 - ($(date +%s) - START) )) python3 scripts/profile_host.py --training --calls 200 --top 30 \
  > $OUT/host_training.log 2>&1
grep -v -i warn $OUT/host_training.log | tail -45
echo "total $(( $(date +%s) - START )) s"
