#!/bin/bash
# session 43 call 1: GPU grid on the leading-rows tree, A/B of the masked forward (base = main a7a766d, aa = its
# copy), sustained table against cuDNN
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
bash scripts/gpu_grid.sh $OUT 180 > $OUT/grid.log 2>&1; cat $OUT/grid.log
T0=$(date +%s)
timeout 220 python3 scripts/ab_kernels.py --tree base=$PWD/.ab/base --tree aa=$PWD/.ab/aa --tree head=$PWD \
  --only "^fwd .*causal|^fwd d64 4x4k full" --rounds 3 --repeats 20 > $OUT/ab_fwd.log 2>&1
tail -16 $OUT/ab_fwd.log; echo "ab $(( $(date +%s) - T0 )) s"
T0=$(date +%s)
timeout 130 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 > $OUT/bench_sustained.log 2>&1
grep -E "forward|backward" $OUT/bench_sustained.log; echo "sustained $(( $(date +%s) - T0 )) s"
