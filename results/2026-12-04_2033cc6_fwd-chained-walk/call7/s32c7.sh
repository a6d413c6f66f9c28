#!/bin/bash
# session 32 call 7: the chained walk with the rescale under S and no stores (timing probe)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .ab/s32c7.sh .ab/sweep_probe2.py $OUT/
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
timeout 280 python .ab/sweep_probe2.py > $OUT/sweep.log 2>&1
grep -v "^  " $OUT/sweep.log | tail -40
grep "^  " $OUT/sweep.log
echo "total $(( $(date +%s) - T0 )) s"
