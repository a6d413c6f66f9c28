#!/bin/bash
# session 34 call 5: 128-key tiles, three stages, under the K/V multicast (tree .ab/x128) against HEAD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT; cp .ab/s34c5.sh $OUT/
T0=$(date +%s)
timeout 230 python scripts/ab_kernels.py --tree head=$ROOT --tree x128=$ROOT/.ab/x128 --only "^fwd d128 (4x4k|8x2k|1x16k) full" --rounds 4 --repeats 20 > $OUT/ab_fwd.log 2>&1
grep -E "after round|graph" $OUT/ab_fwd.log | tail -12
echo "total $(( $(date +%s) - T0 )) s"
