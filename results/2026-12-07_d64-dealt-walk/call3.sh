#!/bin/bash
# Call 3 (warm): is the unmasked walk's new code a cost? main, main2 (an A/A copy), plain (this tree's kernels, the
# list never chosen) and new (the dealt walk), five rounds, d64 rows. Carry .whl and ab.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 500 python3 scripts/ab_kernels.py --tree main=ab/main --tree main2=ab/main2 --tree plain=ab/plain \
  --tree new=ab/new --rounds 5 --only 'fwd d64 (8x2k|4x4k|1x16k) full|fwd d64 4x4k causal$' > $OUT/ab.log 2>&1
tail -14 $OUT/ab.log
echo "total $(( $(date +%s) - START )) s"
