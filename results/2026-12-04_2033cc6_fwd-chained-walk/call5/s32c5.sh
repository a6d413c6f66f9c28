#!/bin/bash
# session 32 call 5: the chained walk at d128: its GPU test, then the sweep
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .ab/s32c5.sh .ab/sweep_chain.py $OUT/
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
timeout 200 python -m pytest -q -x tests/gpu/test_forward.py -k "copied_ahead" -p no:cacheprovider > $OUT/tests.log 2>&1
tail -3 $OUT/tests.log
echo "tests $(( $(date +%s) - T0 )) s"
timeout 280 python .ab/sweep_chain.py > $OUT/sweep.log 2>&1
grep -v "^  " $OUT/sweep.log | tail -40
grep "^  " $OUT/sweep.log
echo "total $(( $(date +%s) - T0 )) s"
