#!/bin/bash
# The held reference with the sums' rounding (ForwardConfig.held_reference; cuda/fwd_softmax.cuh sum_as_read) against
# main (ab/main, 6b28d45). Call 1's held reference alone gained 1.8-3.3 % at d128 but failed one accuracy test (192/128
# 113x113 mqa full: 0.0062 against 2 x 0.0024 + 1e-3). Here the sums take the rounding of a held tile's largest
# probability, as P V reads it, on every Hopper build. The whole GPU grid first, then the A/B, then a profiled
# fine-tune step at 4k. About 500 s with the start. Carry .whl and ab.
# The tree: main with tag s58-held-reference-rounding-draft's cuda/ and hf_flashpatch/kernels/ checked out.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
bash scripts/gpu_grid.sh $OUT 200 > $OUT/grid.log 2>&1; tail -8 $OUT/grid.log
grep -h "kernel error\|^FAILED" $OUT/grid.log | head -5
echo "grid $(( $(date +%s) - START )) s"
timeout $(( 440 - ($(date +%s) - START) )) python3 scripts/ab_kernels.py --tree main=ab/main --tree held=. --rounds 3 \
  --only "^fwd (d128 (8x2k|4x4k) (full|causal)|d128 1x16k full|d64 (4x4k|8x2k) (full|causal)|d192/128 4x4k causal)$" \
  > $OUT/ab.log 2>&1
grep -A10 "after round 1 of" $OUT/ab.log | grep graph
grep -A10 "after round 2 of" $OUT/ab.log | grep graph
grep -A18 "after round 3 of" $OUT/ab.log
# Then the fine-tune's question (../2026-12-06_issue14-table/README.md, session 58): the GPU's idle time inside one
# profiled 16-layer step at 4k per backend (wall time against the kernels' summed time).
timeout $(( 540 - ($(date +%s) - START) )) python3 scripts/profile_training_step.py --layers 16 --seqlen 4096 \
  --attn sdpa,hfpatch > $OUT/profile_4k.log 2>&1
grep -E "^== " $OUT/profile_4k.log
echo "total $(( $(date +%s) - START )) s"
