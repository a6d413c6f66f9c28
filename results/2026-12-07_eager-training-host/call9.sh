#!/bin/bash
# step_ab.py with main's package (ab/main) and the working tree's, in turns, six rounds: the host-bound 4-layer step
# at 128 tokens, sdpa and hfpatch in the same process. Carry .whl, ab. About 200 s.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1 HF_FLASHPATCH_CACHE=/tmp/cA
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
for round in 1 2 3 4 5 6; do
  for tree in ab/main .; do
    name=$([ "$tree" = . ] && echo new || echo main)
    PYTHONPATH=/tmp/site:$PWD/$tree timeout 60 python3 results/2026-12-07_eager-training-host/step_ab.py $name 2>&1 \
      | grep -v -i warn | tee -a $OUT/step_ab.log
  done
done
echo "total $(( $(date +%s) - START )) s"
