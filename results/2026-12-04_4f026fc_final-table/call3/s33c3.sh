#!/bin/bash
# session 33 call 3: the cuDNN table (sustained and quick) with the d128 backward of 4f026fc
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .ab/s33c3.sh $OUT/
T0=$(date +%s)
timeout 200 python scripts/bench_sustained.py --seconds 0.6 --rounds 5 > $OUT/bench_sustained.log 2>&1
cat $OUT/bench_sustained.log
echo "sustained $(( $(date +%s) - T0 )) s"
timeout 110 python scripts/bench_forward.py --quick > $OUT/bench_forward.log 2>&1
grep -E "^ours/sdpa_cudnn" $OUT/bench_forward.log
timeout 100 python scripts/bench_backward.py --quick --only kernels --head-dims 128,64 > $OUT/bench_backward.log 2>&1
grep -E "^ours/sdpa_cudnn " $OUT/bench_backward.log
echo "total $(( $(date +%s) - T0 )) s"
