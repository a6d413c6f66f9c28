#!/bin/bash
# Call 1 (session 65; an H200, the issue's card): issue 14's backward rows at 4k, 8k and 16k (not read on an H200
# since session 57), sustained, ours / cuDNN, then the 16-layer fine-tune at one 16k sequence while the call's time
# allows. Committed tree. Carry .whl.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
timeout 240 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 --seqlens 4096 8192 16384 \
  --head-dims 128 64 --parts backward > $OUT/sustained_backward.log 2>&1
grep backward $OUT/sustained_backward.log
echo "backward $(( $(date +%s) - START )) s"
LEFT=$(( ${1:-560} - ($(date +%s) - START) ))
if [ $LEFT -gt 100 ]; then
  HF_FLASHPATCH_CACHE=/tmp/cA timeout $LEFT python3 scripts/bench_backward.py --only training > $OUT/training.log 2>&1
  grep -E '^(series|sdpa|hfpatch)' $OUT/training.log
else
  echo "training not run: $LEFT s left"
fi
echo "total $(( $(date +%s) - START )) s"
