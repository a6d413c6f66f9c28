#!/bin/bash
# Planned for the next device session (not run): the step timelines of main's chain and of the shadow build (tag
# s47-shadow-boundary-lost, 4-5 % slower for a cost its SASS does not show) at 8x2k and 4x4k. Before, on the
# development machine:
#   for t in main:ab_tl_main s47-shadow-boundary-lost:ab_tl_shadow; do mkdir -p ${t#*:} &&
#     git archive ${t%%:*} cuda hf_flashpatch | tar x -C ${t#*:}; done
#   (cd ab_tl_main && patch -p1 < ../results/2026-12-05_chain-boundary/chain_timeline.diff)
#   (cd ab_tl_shadow && patch -p1 < ../results/2026-12-05_chain-boundary/chain_timeline_shadow.diff)
# and carry ab_tl_main, ab_tl_shadow (untracked) with .whl.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
for tree in ab_tl_main ab_tl_shadow; do
  for seqlen in 2048 4096; do
    timeout 60 python3 results/2026-12-05_chain-boundary/chain_timeline.py $tree $seqlen > $OUT/timeline_${tree}_$seqlen.log 2>&1
    echo "== $tree $seqlen"; tail -30 $OUT/timeline_${tree}_$seqlen.log | grep -v "^/"
  done
done
echo "total $(( $(date +%s) - START )) s"
