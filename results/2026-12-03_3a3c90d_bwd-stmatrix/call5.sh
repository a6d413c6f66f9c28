#!/bin/bash
# session 23 call 5: the 16-layer Llama-1B-shaped fine-tune (README table) on main (3a3c90d's kernels):
# one 4k and one 16k sequence, and a 16k row of packed documents; sdpa, sdpa held to flash and hfpatch in one run
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/t16 timeout 250 python scripts/bench_backward.py --only training,packed > $OUT/bench_training16.log 2>&1
grep -vE "Warn|warn" $OUT/bench_training16.log | tail -20
echo "total $(( $(date +%s) - T0 )) s"
