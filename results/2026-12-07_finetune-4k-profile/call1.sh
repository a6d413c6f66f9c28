#!/bin/bash
# Why the 16-layer fine-tune at one 4k sequence reads 0.947 of `sdpa` on the H200 (0.988-0.997 on the H100) while
# the attention of its shape alone reads 1.264x cuDNN: the profiled step's kernels (top 25 with launch counts, GPU
# idle = wall minus the kernels' summed time) for both backends, then the fine-tune rows twice. Either card (say
# which ran it). About 300 s with the start. Carry .whl.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
lscpu | grep -E '^(Model name|CPU\(s\)|CPU max MHz)'
git log --oneline -1
export HF_FLASHPATCH_CACHE=/tmp/cA
timeout 150 python3 scripts/profile_training_step.py --layers 16 --seqlen 4096 --attn sdpa,hfpatch --top 25 \
  > $OUT/profile_4k.log 2>&1
cat $OUT/profile_4k.log | grep -v Warning
for run in 1 2; do
  timeout 120 python3 scripts/bench_backward.py --only training > $OUT/training_$run.log 2>&1
  grep -E '^(sdpa|hfpatch)' $OUT/training_$run.log
done
timeout 150 python3 scripts/bench_backward.py --only finetune_shapes > $OUT/finetune_shapes.log 2>&1
grep -E "fine-tune shape|ours|cudnn" $OUT/finetune_shapes.log | head -30
echo "total $(( $(date +%s) - START )) s"
