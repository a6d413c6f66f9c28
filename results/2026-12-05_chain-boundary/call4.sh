#!/bin/bash
# Session 49, call 2 (after call5.sh). Why does the shadow build (tag s47-shadow-boundary-lost) lose 4-5 %
# a step when its steady path in the SASS is as long as main's?
# 1. The A/B of kernel time: main / shadow / four probes on shadow's code (tags s47-shadow-probe-*): "none" (all its
#    per-work code after the P V wait, as main: the refactor alone), and only "finish", "copy" or "switch" before it.
# 2. The step timelines of main's chain and of shadow at 8x2k and 4x4k (chain_timeline.py).
# Before, on the development machine (untracked trees, carried with .whl; 8 carry paths at most):
#   for t in main:ab_main s47-shadow-boundary-lost:ab_shadow s47-shadow-probe-none:ab_none \
#            s47-shadow-probe-finish:ab_finish s47-shadow-probe-copy:ab_copy s47-shadow-probe-switch:ab_switch \
#            main:ab_tl_main s47-shadow-boundary-lost:ab_tl_shadow; do
#     mkdir -p ${t#*:} && git archive ${t%%:*} cuda hf_flashpatch scripts | tar x -C ${t#*:}; done
#   (cd ab_tl_main && patch -p1 < ../results/2026-12-05_chain-boundary/chain_timeline.diff)
#   (cd ab_tl_shadow && patch -p1 < ../results/2026-12-05_chain-boundary/chain_timeline_shadow.diff)
# carry: .whl ab_main ab_shadow ab_none ab_finish ab_copy ab_switch ab_tl_main ab_tl_shadow does not fit (9 paths):
# move the trees under one folder (ab/) and carry .whl and ab.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
timeout 300 python3 scripts/ab_kernels.py --tree main=ab/ab_main --tree shadow=ab/ab_shadow --tree none=ab/ab_none \
  --tree finish=ab/ab_finish --tree copy=ab/ab_copy --tree switch=ab/ab_switch --rounds 3 \
  --only "^fwd d128 (8x2k|4x4k) full$" > $OUT/ab_probes.log 2>&1
tail -6 $OUT/ab_probes.log
echo "ab $(( $(date +%s) - START )) s"
for tree in ab/ab_tl_main ab/ab_tl_shadow; do
  for seqlen in 2048 4096; do
    name=$(basename $tree)
    timeout 60 python3 results/2026-12-05_chain-boundary/chain_timeline.py $tree $seqlen > $OUT/timeline_${name}_$seqlen.log 2>&1
    echo "== $name $seqlen"; grep -v "^/" $OUT/timeline_${name}_$seqlen.log | tail -30
  done
done
LEFT=$(( 540 - ($(date +%s) - START) ))
if [ $LEFT -gt 150 ]; then  # the final table of main: sustained ours / cuDNN, every issue-14 cell
  timeout $(( LEFT - 10 )) python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 > $OUT/bench_sustained.log 2>&1
  grep -E "forward|backward" $OUT/bench_sustained.log
fi
echo "total $(( $(date +%s) - START )) s"
