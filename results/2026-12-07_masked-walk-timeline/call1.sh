#!/bin/bash
# Call 1 (any card): where a masked d128 work's time goes, at 8x2k, 4x4k and 2x8k causal (the open lead "Causal d128
# at 8k" in notes/forward.md). Before the call: `rm -rf ab && mkdir -p ab/tl && git archive HEAD cuda hf_flashpatch |
# tar -x -C ab/tl && python3 results/2026-12-07_masked-walk-timeline/instrument.py ab/tl`. Carry .whl and ab.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
for n in 2048 4096 8192; do
  HF_FLASHPATCH_CACHE=/tmp/cTL timeout 120 python3 results/2026-12-07_masked-walk-timeline/walk_timeline.py ab/tl $n \
    $OUT/raw_$n.npz 2>&1 | tee $OUT/timeline_$n.log | tail -9
done
echo "total $(( $(date +%s) - START )) s"
