#!/bin/bash
# session 31 call 6: unmasked d128, Q by the TMA or the staged output, sustained timing
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .ab/s31c6.sh .ab/shape_sweep2.py $OUT/
T0=$(date +%s)
timeout 220 python .ab/shape_sweep2.py > $OUT/shape_sweep2.log 2>&1
cat $OUT/shape_sweep2.log | tail -24
echo "total $(( $(date +%s) - T0 )) s"
