#!/bin/bash
# session 27 call 4: 1995d8b (masked d128 Q by the TMA) against fedec8c on the d128 rows, the forward bench.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT
cp .ab/s27c4.sh $OUT/
T0=$(date +%s)
timeout 170 python scripts/ab_kernels.py --tree main=$ROOT/.ab/main_tree --tree new=$ROOT --only "^fwd d128 (8x2k|4x4k causal|1x16k causal)" --rounds 3 --repeats 20 > $OUT/ab_fwd.log 2>&1
tail -6 $OUT/ab_fwd.log | grep graph
HF_FLASHPATCH_CACHE=/tmp/cA timeout 100 python scripts/bench_forward.py --quick > $OUT/bench_forward_quick.log 2>&1
grep -E "ours/sdpa_cudnn" $OUT/bench_forward_quick.log
echo "total $(( $(date +%s) - T0 )) s"
