#!/bin/bash
# session 44's last try, on what device time was left after the refusals: the GPU grid alone on the fixed tree
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
bash scripts/gpu_grid.sh $OUT 170 > $OUT/grid.log 2>&1; tail -25 $OUT/grid.log
