#!/bin/bash
# session 35 call 7: the 16-layer Llama-1B-shaped fine-tune tokens/s (one 4k / one 16k sequence) at feaf60e, shipped kernels
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .ab/s35c7.sh $OUT/
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/cA timeout 200 python scripts/bench_backward.py --only training > $OUT/bench_training16.log 2>&1
grep -E '^(series|sdpa|hfpatch)' $OUT/bench_training16.log
echo "total $(( $(date +%s) - T0 )) s"
