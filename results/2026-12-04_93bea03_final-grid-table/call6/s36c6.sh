#!/bin/bash
# session 36 call 6: the whole GPU grid at 3f9c823 (the final tree) through scripts/gpu_grid.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .ab/s36c6.sh $OUT/
bash scripts/gpu_grid.sh $OUT 230
