#!/bin/bash
# The online softmax's reference maximum moves only when a tile's maximum passes it by more than 2^8
# (FlashAttention-4's rule; cuda/fwd_softmax.cuh kMaxRiseLog2) against main (ab/main, 6b28d45): most steps then skip
# O's rescale. Not bit-identical (the exponentials subtract another reference), so the whole GPU grid runs on it
# first, then the A/B of kernel time (d128 unmasked and masked at 2k / 4k / 16k, d64 masked, 192/128). About 480 s
# with the start. Carry .whl and ab (ab/main = git archive 6b28d45 cuda hf_flashpatch scripts).
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
bash scripts/gpu_grid.sh $OUT 200 > $OUT/grid.log 2>&1; tail -8 $OUT/grid.log
echo "grid $(( $(date +%s) - START )) s"
timeout $(( 570 - ($(date +%s) - START) )) python3 scripts/ab_kernels.py --tree main=ab/main --tree rise=. --rounds 3 \
  --only "^fwd (d128 (8x2k|4x4k) (full|causal)|d128 1x16k full|d64 (4x4k|8x2k) causal|d192/128 4x4k causal)$" \
  > $OUT/ab.log 2>&1
grep -A10 "after round 1 of" $OUT/ab.log | grep graph
grep -A10 "after round 2 of" $OUT/ab.log | grep graph
grep -A18 "after round 3 of" $OUT/ab.log
echo "total $(( $(date +%s) - START )) s"
