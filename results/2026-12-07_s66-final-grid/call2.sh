#!/bin/bash
# Call 2 (any card; the issue's card is an H200): issue 14's whole table on the committed code in one call,
# sustained, ours / cuDNN: the forward and the backward at 2k-16k, d128 and d64, then the 16-layer fine-tune while
# the call's time allows. Carry .whl.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
HF_FLASHPATCH_CACHE=/tmp/cS timeout 200 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 \
  --seqlens 2048 4096 8192 16384 --head-dims 128 64 --parts forward > $OUT/sustained_forward.log 2>&1
grep forward $OUT/sustained_forward.log
echo "forward $(( $(date +%s) - START )) s"
HF_FLASHPATCH_CACHE=/tmp/cS timeout 240 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 \
  --seqlens 2048 4096 8192 16384 --head-dims 128 64 --parts backward > $OUT/sustained_backward.log 2>&1
grep backward $OUT/sustained_backward.log
echo "backward $(( $(date +%s) - START )) s"
LEFT=$(( ${1:-570} - ($(date +%s) - START) ))
if [ $LEFT -gt 100 ]; then
  HF_FLASHPATCH_CACHE=/tmp/cA timeout $LEFT python3 scripts/bench_backward.py --only training > $OUT/training.log 2>&1
  grep -E '^(series|sdpa|hfpatch)' $OUT/training.log
else
  echo "training not run: $LEFT s left"
fi
echo "total $(( $(date +%s) - START )) s"
