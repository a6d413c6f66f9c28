#!/bin/bash
# For the next session, on either card (say which ran it): why the 16-layer fine-tune at one 4k sequence read 0.947
# of `sdpa` on the H200 in session 57 (rounds 0.838-0.959) against 1.02 on the H100 in session 56. The attention of
# that shape alone (32 / 8 heads of 64, causal, one sequence of 2k-16k: bench_backward's finetune_shapes), then the
# fine-tune twice (six rounds of 4k and 16k in all), then the GPU grid while the call's time allows. About 500 s with
# the start. Carry .whl. On the H200 our tokens/s at 4k fell below the H100's (4.28e4 against 4.57e4) while sdpa's
# rose (4.68e4 against 4.48e4), and at 16k both rose: a host-side cost that a 4k step (90 ms) shows and a 16k one
# hides would read so; the host's CPU is printed first.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
lscpu | grep -E '^(Model name|CPU\(s\)|CPU max MHz)'  # the host: the 4k step is about 90 ms, the 16k one 420 ms
export HF_FLASHPATCH_CACHE=/tmp/cA
timeout 150 python3 scripts/bench_backward.py --only finetune_shapes > $OUT/finetune_shapes.log 2>&1
grep -E "fine-tune shape|ours|cudnn" $OUT/finetune_shapes.log | head -30
# GPU idle inside one profiled 16-layer step at 4k (wall minus the kernels' summed time): a host-bound step shows it
timeout 120 python3 scripts/profile_training_step.py --layers 16 --seqlen 4096 --attn sdpa,hfpatch \
  > $OUT/profile_4k.log 2>&1
grep -E "^== " $OUT/profile_4k.log
for run in 1 2; do
  timeout 120 python3 scripts/bench_backward.py --only training > $OUT/training_$run.log 2>&1
  grep -E '^(sdpa|hfpatch)' $OUT/training_$run.log
done
echo "fine-tune $(( $(date +%s) - START )) s"
LEFT=$(( 560 - ($(date +%s) - START) ))
[ $LEFT -gt 200 ] && { bash scripts/gpu_grid.sh $OUT $(( LEFT - 30 )) > $OUT/grid.log 2>&1; tail -12 $OUT/grid.log; }
echo "total $(( $(date +%s) - START )) s"
