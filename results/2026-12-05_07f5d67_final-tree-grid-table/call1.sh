#!/bin/bash
# session 40 call 1: the GPU grid on the final tree (session 39's GPU tests run for the first time), then the
# sustained table and the 16-layer fine-tune (session 38's planned call 3)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
bash scripts/gpu_grid.sh $OUT 170
T0=$(date +%s)
timeout 140 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 > $OUT/bench_sustained.log 2>&1
grep -E "forward|backward" $OUT/bench_sustained.log
echo "sustained $(( $(date +%s) - T0 )) s"
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/cA timeout 170 python3 scripts/bench_backward.py --only training > $OUT/bench_training16.log 2>&1
grep -E '^(series|sdpa|hfpatch)' $OUT/bench_training16.log
echo "training $(( $(date +%s) - T0 )) s"
