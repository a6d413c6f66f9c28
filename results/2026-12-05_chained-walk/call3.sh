#!/bin/bash
# session 46, call 3: the chained walk shipped for unmasked d128 (160-key tiles everywhere, chained up to 4096 keys):
# the whole GPU grid, then the sustained table against cuDNN (bench_sustained) and the tile shapes in one process.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
bash scripts/gpu_grid.sh $OUT 175 > $OUT/grid.log 2>&1; tail -14 $OUT/grid.log
T0=$(date +%s)
timeout 150 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 > $OUT/bench_sustained.log 2>&1
grep -E "forward|backward" $OUT/bench_sustained.log
echo "sustained $(( $(date +%s) - T0 )) s"
timeout 110 python3 results/2026-12-05_chained-walk/sustained_shapes.py --seconds 0.6 --rounds 5 --seqlens 2048 4096 > $OUT/sustained_shapes.log 2>&1
tail -3 $OUT/sustained_shapes.log
echo "total $(( $(date +%s) - START )) s"
