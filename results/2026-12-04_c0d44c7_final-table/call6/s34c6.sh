#!/bin/bash
# session 34 call 6: issue 14 table with the K/V multicast (HEAD): sustained, quick forward, quick backward
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .ab/s34c6.sh $OUT/
T0=$(date +%s)
timeout 200 python scripts/bench_sustained.py --seconds 0.6 --rounds 5 > $OUT/bench_sustained.log 2>&1
cat $OUT/bench_sustained.log
echo "sustained $(( $(date +%s) - T0 )) s"
timeout 110 python scripts/bench_forward.py --quick > $OUT/bench_forward.log 2>&1
grep -E "^ours/sdpa_cudnn" $OUT/bench_forward.log
timeout 100 python scripts/bench_backward.py --quick --only kernels --head-dims 128,64 > $OUT/bench_backward.log 2>&1
grep -E "^ours/sdpa_cudnn " $OUT/bench_backward.log
echo "total $(( $(date +%s) - T0 )) s"
