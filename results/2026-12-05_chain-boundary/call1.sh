#!/bin/bash
# session 47, call 1: where the unmasked chain's 2k time goes (boundary_sweep.py on this tree: the nested chained
# step at every length against 160-key tiles work by work), and the A/B of kernel time over three trees:
# main = 7e3f588 (the shipped chain: its first step-per-work tests, up to 4096 keys; causal: three stages, Q by TMA);
# nested = this tree with the chain at every length and on causal walks (two stages, output boxes);
# plain = this tree without the chain (causal: the same two-stage tiles work by work).
# Before: git archive main | tar x -C ab_main; the same of HEAD into ab_nested / ab_plain with their heuristics edited.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
timeout 120 python3 results/2026-12-05_chain-boundary/boundary_sweep.py > $OUT/boundary_sweep.log 2>&1; cat $OUT/boundary_sweep.log
echo "sweep $(( $(date +%s) - START )) s"
timeout 330 python3 scripts/ab_kernels.py --tree main=ab_main --tree nested=ab_nested --tree plain=ab_plain --rounds 3 --only "^fwd d128 (8x2k|4x4k|2x8k|1x16k) full$|^fwd d128 (8x2k|4x4k|1x16k) causal$" > $OUT/ab_chain.log 2>&1
tail -16 $OUT/ab_chain.log
echo "total $(( $(date +%s) - START )) s"
