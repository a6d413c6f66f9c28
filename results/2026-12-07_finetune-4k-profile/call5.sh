#!/bin/bash
# Call 4 cut to about 175 s of command (refused starts left about 300 s of device time): the 4k fine-tune's profile
# (call 2's question 1), then ab/fma_h1 against ab/main at d128 8x2k full and d64 4x4k causal
# (question 2) while the time lasts; no GPU tests of the draft (a landing would need them first). Carry .whl and ab.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
lscpu | grep -E '^(Model name|CPU\(s\))'
export HF_FLASHPATCH_CACHE=/tmp/cA
timeout 95 python3 scripts/profile_training_step.py --layers 16 --seqlen 4096 --attn sdpa,hfpatch --top 25 \
  > $OUT/profile_4k.log 2>&1
grep -v -i warn $OUT/profile_4k.log | grep -v "^  _warn\|^$"
echo "profile $(( $(date +%s) - START )) s"
timeout $(( 175 - ($(date +%s) - START) )) python3 scripts/ab_kernels.py --tree main=ab/main --tree fma_h1=ab/fma_h1 \
  --rounds 3 --only "^fwd (d128 8x2k full|d64 4x4k causal)$" > $OUT/ab.log 2>&1
grep -B2 -A8 "after round" $OUT/ab.log | grep -E "round|graph"
echo "total $(( $(date +%s) - START )) s"
