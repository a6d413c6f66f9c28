#!/bin/bash
# Call 5 (warm, right after call 4 on the same H200): the forward rows at 8k and 16k, sustained. Carry .whl.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
timeout 120 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 --seqlens 8192 16384 --head-dims 128 64 \
  --parts forward > $OUT/sustained_h200_8k_16k.log 2>&1
grep forward $OUT/sustained_h200_8k_16k.log
