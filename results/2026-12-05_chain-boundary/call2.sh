#!/bin/bash
# session 47, call 2: the A/B of kernel time main (ab_main: 7e3f588) / deferred (ab_deferred: c2726a8, a work's output
# stored under the next work's second S) / kept (this tree: deferred, and the next and previous works' QueryTile
# kept in registers rather than recomputed at the switch and the store); then the whole GPU grid and bench_sustained
# on this tree, and the step timeline of main's chain at 8x2k (ab_tl: main + chain_timeline.diff).
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
timeout 150 python3 scripts/ab_kernels.py --tree main=ab_main --tree deferred=ab_deferred --tree kept=. --rounds 3 --only "^fwd d128 (8x2k|4x4k) full$" > $OUT/ab_kept.log 2>&1
tail -6 $OUT/ab_kept.log
echo "ab $(( $(date +%s) - START )) s"
bash scripts/gpu_grid.sh $OUT 215 > $OUT/grid.log 2>&1; tail -14 $OUT/grid.log
echo "grid $(( $(date +%s) - START )) s"
timeout 150 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 > $OUT/bench_sustained.log 2>&1
grep -E "forward|backward" $OUT/bench_sustained.log
echo "sustained $(( $(date +%s) - START )) s"
timeout 60 python3 results/2026-12-05_chain-boundary/chain_timeline.py ab_tl > $OUT/chain_timeline.log 2>&1; tail -18 $OUT/chain_timeline.log
echo "total $(( $(date +%s) - START )) s"
