#!/bin/bash
# Session 50, call 4: session 49's call4.sh A/B alone (the shadow build's probes: main / shadow / none / finish / copy /
# switch, kernel time at 8x2k and 4x4k full; trees and tags as that script's header says), in the device time left.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 330 python3 scripts/ab_kernels.py --tree main=ab/ab_main --tree shadow=ab/ab_shadow --tree none=ab/ab_none \
  --tree finish=ab/ab_finish --tree copy=ab/ab_copy --tree switch=ab/ab_switch --rounds 3 \
  --only "^fwd d128 (8x2k|4x4k) full$" > $OUT/ab_probes.log 2>&1
grep -B1 -A5 "after round" $OUT/ab_probes.log | tail -14
echo "total $(( $(date +%s) - START )) s"
