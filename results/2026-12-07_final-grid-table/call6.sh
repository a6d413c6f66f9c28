#!/bin/bash
# Call 6 (warm, right after call 5 on the same H200): the backward rows at 2k, sustained. Carry .whl.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
timeout 100 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 --seqlens 2048 --head-dims 128 64 \
  --parts backward > $OUT/sustained_h200_bwd_2k.log 2>&1
grep backward $OUT/sustained_h200_bwd_2k.log
