#!/bin/bash
# session 31 call 5: tile shapes at 2k / 4k in the sustained timing (unchanged kernels, alternative TileShapes)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .ab/s31c5.sh .ab/shape_sweep.py $OUT/
T0=$(date +%s)
timeout 220 python .ab/shape_sweep.py > $OUT/shape_sweep.log 2>&1
cat $OUT/shape_sweep.log | tail -24
echo "total $(( $(date +%s) - T0 )) s"
