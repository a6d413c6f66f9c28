#!/bin/bash
# session 38 call 1: A/B base / aa / d64 overlap (2 and 3 stages), then the GPU grid on the overlap tree
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .ab/s38c1.sh $OUT/
ROOT=$PWD
PYTHONPATH=/tmp/site:$ROOT timeout 345 python3 scripts/ab_kernels.py --tree base=$ROOT/.ab/base --tree aa=$ROOT/.ab/aa \
  --tree x=$ROOT/.ab/x --tree y=$ROOT/.ab/y \
  --only 'fwd d64|fwd d128 8x2k causal' --rounds 3 --repeats 20 2>&1 | tee $OUT/ab.log | tail -24
cd $ROOT/.ab/x && PYTHONPATH=/tmp/site:$ROOT/.ab/x bash scripts/gpu_grid.sh $OUT 200 2>&1 | tee $OUT/grid.log
