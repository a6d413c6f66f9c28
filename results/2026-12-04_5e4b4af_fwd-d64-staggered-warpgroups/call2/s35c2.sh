#!/bin/bash
# session 35 call 2: d64 warpgroups started apart (probe): A/B of base, k6, k6s, k4s
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT; cp .ab/s35c2.sh $OUT/
T0=$(date +%s)
timeout 420 python scripts/ab_kernels.py --tree base=$ROOT/.ab/base --tree k6=$ROOT/.ab/k6 --tree k6s=$ROOT/.ab/k6s --tree k4s=$ROOT/.ab/k4s --only "^fwd (d64 (8x2k|4x4k|1x16k causal)|d128 8x2k full)" --rounds 3 --repeats 20 > $OUT/ab_fwd.log 2>&1
grep -A12 "after round" $OUT/ab_fwd.log | grep -E "after round|graph" | tail -20
echo "total $(( $(date +%s) - T0 )) s"
