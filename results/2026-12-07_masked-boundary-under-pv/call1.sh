#!/bin/bash
# Call 1 (any card), from a checkout of the draft (tag s67-masked-boundary-draft): the forward's GPU tests on it, then
# kernel time against main and the early variant (A/B, CUDA graphs). Before the call: `rm -rf ab && mkdir -p ab/main
# ab/new ab/early && git archive main cuda hf_flashpatch scripts | tar -x -C ab/main && for t in new early; do git
# archive s67-masked-boundary-draft cuda hf_flashpatch scripts | tar -x -C ab/$t; done && (cd ab/early && patch -p1
# < ../../results/2026-12-07_masked-boundary-under-pv/early_variant.diff) && mkdir ab/tl && git archive
# s67-masked-boundary-draft cuda hf_flashpatch | tar -x -C ab/tl && python3
# results/2026-12-07_masked-walk-timeline/instrument.py ab/tl` (the draft's timeline last). Carry .whl and ab.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
HF_FLASHPATCH_CACHE=/tmp/cT timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py \
  tests/gpu/test_forward_walks.py > $OUT/forward_tests.log 2>&1
tail -3 $OUT/forward_tests.log
echo "tests $(( $(date +%s) - START )) s"
timeout $(( ${1:-560} - ($(date +%s) - START) - 110 )) python3 scripts/ab_kernels.py --tree main=ab/main --tree new=ab/new \
  --tree early=ab/early --rounds 4 --only 'fwd d128 (8x2k|4x4k|2x8k|1x16k) causal$|fwd d128 (8x2k|1x16k) full' \
  > $OUT/ab.log 2>&1
grep -B1 -A14 "after round" $OUT/ab.log | grep -E "after|case|graph" | tail -16
for n in 2048 4096; do
  [ $(( ${1:-560} - ($(date +%s) - START) )) -gt 40 ] || break
  HF_FLASHPATCH_CACHE=/tmp/cTL PYTHONPATH=/tmp/site timeout 60 python3 results/2026-12-07_masked-walk-timeline/walk_timeline.py \
    ab/tl $n $OUT/raw_$n.npz > $OUT/timeline_$n.log 2>&1
  tail -7 $OUT/timeline_$n.log
done
echo "total $(( $(date +%s) - START )) s"
