#!/bin/bash
# Call 3 (any card, after call 1 on a warm machine): the forward rows of issue 14, sustained, with the working tree's
# kernels (the draft applied). Carry .whl.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
HF_FLASHPATCH_CACHE=/tmp/cS timeout 420 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 \
  --seqlens 2048 4096 8192 16384 --head-dims 128 64 --parts forward 2>&1 | tee $OUT/sustained.log | tail -30
