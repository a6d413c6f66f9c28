#!/bin/bash
# session 38 call 2: A/B base / aa / new (the work tree: d64 overlap shipped), the sustained table, the GPU grid on new
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .ab/s38c2.sh $OUT/
ROOT=$PWD
T0=$(date +%s)
timeout 235 python3 scripts/ab_kernels.py --tree base=$ROOT/.ab/base --tree aa=$ROOT/.ab/aa --tree new=$ROOT \
  --only 'fwd d64|fwd d128 (8x2k|1x16k)|fwd d192' --rounds 3 --repeats 20 > $OUT/ab.log 2>&1
grep -A30 "after round" $OUT/ab.log | grep graph | tail -12
echo "ab $(( $(date +%s) - T0 )) s"
T0=$(date +%s)
timeout 150 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 > $OUT/bench_sustained.log 2>&1
grep -E "forward|backward" $OUT/bench_sustained.log
echo "sustained $(( $(date +%s) - T0 )) s"
bash scripts/gpu_grid.sh $OUT 180 2>&1 | tee $OUT/grid.log
