#!/bin/bash
# Call 2 (warm machine after call 1): A/B of kernel time, main against the dealt walk's tree, then the d64 unmasked
# rows against cuDNN in the sustained regime. Carry .whl and ab.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 380 python3 scripts/ab_kernels.py --tree main=ab/main --tree new=ab/new --rounds 3 \
  --only 'fwd d64 (8x2k|4x4k|1x16k) full|fwd d128 (8x2k|1x16k) full|fwd d64 4x4k causal$|fwd d192/128 4x4k full' \
  > $OUT/ab.log 2>&1
tail -30 $OUT/ab.log
PYTHONPATH=/tmp/site:$PWD/ab/new timeout 150 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 \
  --seqlens 2048 4096 --head-dims 64 --masks full --parts forward > $OUT/sustained.log 2>&1
grep -E "forward" $OUT/sustained.log
echo "total $(( $(date +%s) - START )) s"
