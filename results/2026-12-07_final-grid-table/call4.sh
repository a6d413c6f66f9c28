#!/bin/bash
# Call 4 (an H200, the card, if one starts; what the session's device time left allows): the forward rows
# at 2k and 4k, sustained. Carry .whl.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
timeout 150 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 --seqlens 2048 4096 --head-dims 128 64 \
  --parts forward > $OUT/sustained_h200.log 2>&1
grep forward $OUT/sustained_h200.log
