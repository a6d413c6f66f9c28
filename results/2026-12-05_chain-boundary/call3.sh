#!/bin/bash
# session 47, call 3: "shadow" (this tree: the chain's per-work code that does not read O runs under the P V wait):
# the chain's GPU tests, the A/B of kernel time against main (ab_main: 7e3f588), the whole GPU grid, then sustained
# ours / cuDNN for 160-key tiles work by work (twice) and the chain at 2k and 4k.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
timeout 100 python3 -m pytest -q tests/gpu/test_forward_chained_walk.py > $OUT/tests_chain.log 2>&1; tail -3 $OUT/tests_chain.log
timeout 120 python3 scripts/ab_kernels.py --tree main=ab_main --tree shadow=. --rounds 3 --only "^fwd d128 (8x2k|4x4k) full$" > $OUT/ab_shadow.log 2>&1
tail -6 $OUT/ab_shadow.log
echo "ab $(( $(date +%s) - START )) s"
bash scripts/gpu_grid.sh $OUT 200 > $OUT/grid.log 2>&1; tail -8 $OUT/grid.log
echo "grid $(( $(date +%s) - START )) s"
timeout 90 python3 results/2026-12-05_chained-walk/sustained_shapes.py --no-176 --seconds 0.5 --rounds 5 --seqlens 2048 4096 > $OUT/sustained_shapes.log 2>&1
tail -3 $OUT/sustained_shapes.log
echo "total $(( $(date +%s) - START )) s"
