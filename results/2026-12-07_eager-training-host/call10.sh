#!/bin/bash
# The GPU grid on the review commit (the decode's q alignment through aligned(), build() memoised by lru_cache).
# Carry .whl. About 200 s.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
bash scripts/gpu_grid.sh $OUT 200 > $OUT/grid.log 2>&1; echo "grid rc $?"
cat $OUT/grid.log
