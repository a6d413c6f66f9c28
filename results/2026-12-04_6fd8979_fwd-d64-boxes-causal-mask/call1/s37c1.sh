#!/bin/bash
# session 37 call 1: A/B base / d64 boxes / boxes + causal mask, then the GPU grid on the work tree
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .ab/s37c1.sh $OUT/
ROOT=$PWD
timeout 320 python3 scripts/ab_kernels.py --tree base=$ROOT/.ab/base --tree boxes=$ROOT/.ab/boxes --tree x=$ROOT/.ab/x \
  --only 'fwd d64|fwd d128 (8x2k|4x4k|1x16k) causal' --rounds 3 --repeats 20 2>&1 | tee $OUT/ab.log | tail -40
bash scripts/gpu_grid.sh $OUT 220 2>&1 | tee $OUT/grid.log
