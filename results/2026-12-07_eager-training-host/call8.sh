#!/bin/bash
# host_ab.py with main's package (ab/main) and the working tree's, in turns, eight rounds: call 7's means moved 30 %
# between periods, so each row here is the fastest of five loops. Carry .whl, ab. About 150 s.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1 HF_FLASHPATCH_CACHE=/tmp/cA
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
for round in 1 2 3 4 5 6 7 8; do
  for tree in ab/main .; do
    name=$([ "$tree" = . ] && echo new || echo main)
    PYTHONPATH=/tmp/site:$PWD/$tree timeout 40 python3 results/2026-12-07_eager-training-host/host_ab.py $name 2>&1 \
      | grep -v -i warn | tee -a $OUT/host_ab.log
  done
done
echo "total $(( $(date +%s) - START )) s"
