#!/bin/bash
# Call 2 cut to about 380 s of command (refused starts left about 700 s of device time): the profile, no fine-tune rows,
# fewer A/B cases (d128 8x2k full, 4x4k causal, 1x16k full; d64 8x2k full, 4x4k causal).
# 1. Why the 16-layer fine-tune at one 4k sequence reads 0.947 of `sdpa` on the H200 (0.988-0.997 on the H100) while
#    the attention of its shape alone reads 1.264x cuDNN: the profiled step's kernels (top 25, launch counts, GPU
#    idle = wall minus the kernels' summed time) for both backends.
# 2. Part of the softmax's exponentials on the FMA pipe (exp2_on_fma, FlashAttention-4's exponential): trees
#    ab/fma_h1 (the second row's odd column blocks: 16 of 80 a thread) and ab/fma_5 (every fifth block, 16 of 80)
#    against ab/main (main's kernels), kernel time in CUDA graphs, then fma_h1's forward GPU tests.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
lscpu | grep -E '^(Model name|CPU\(s\))'
export HF_FLASHPATCH_CACHE=/tmp/cA
timeout 120 python3 scripts/profile_training_step.py --layers 16 --seqlen 4096 --attn sdpa,hfpatch --top 25 \
  > $OUT/profile_4k.log 2>&1
grep -v -i warn $OUT/profile_4k.log | grep -v "^  _warn\|^$"
echo "fine-tune $(( $(date +%s) - START )) s"
timeout $(( 300 - ($(date +%s) - START) )) python3 scripts/ab_kernels.py --tree main=ab/main --tree fma_h1=ab/fma_h1 \
  --tree fma_5=ab/fma_5 --rounds 2 \
  --only "^fwd (d128 8x2k full|d128 4x4k causal|d128 1x16k full|d64 8x2k full|d64 4x4k causal)$" > $OUT/ab.log 2>&1
grep -A10 "after round 1 of" $OUT/ab.log | grep graph
grep -A20 "after round 2 of" $OUT/ab.log
echo "ab $(( $(date +%s) - START )) s"
cd ab/fma_h1  # the draft's package first on the path (python -m puts the working directory first)
python3 -c "import hf_flashpatch; print('tests of', hf_flashpatch.__file__)"
HF_FLASHPATCH_CACHE=/tmp/cT timeout $(( 380 - ($(date +%s) - START) )) python3 -m pytest -q -m gpu -p no:cacheprovider \
  -x ../../tests/gpu/test_forward.py ../../tests/gpu/test_forward_chained_walk.py > $OUT/tests.log 2>&1
tail -3 $OUT/tests.log; grep -E "^(FAILED|ERROR)" $OUT/tests.log | head -5
echo "total $(( $(date +%s) - START )) s"
