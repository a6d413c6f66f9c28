#!/bin/bash
# Call 1 (any card), from a checkout of the draft (branch s67-masked-boundary): kernel time of main, the draft (new),
# its early-release variant and its Q-prefetch variant (A/B, CUDA graphs), then the forward's GPU tests on the draft,
# then, while time is left, the draft's own timeline. Before the call (from the checkout):
#   rm -rf ab && mkdir -p ab/main ab/new ab/early ab/qpf ab/tl
#   git archive main cuda hf_flashpatch scripts | tar -x -C ab/main
#   for t in new early qpf; do git archive s67-masked-boundary-draft cuda hf_flashpatch scripts | tar -x -C ab/$t; done
#   (cd ab/early && patch -p1 < ../../results/2026-12-07_masked-boundary-under-pv/early_variant.diff)
#   (cd ab/qpf && patch -p1 < ../../results/2026-12-07_masked-boundary-under-pv/q_prefetch_variant.diff)
#   git archive s67-masked-boundary-draft cuda hf_flashpatch | tar -x -C ab/tl
#   python3 results/2026-12-07_masked-walk-timeline/instrument.py ab/tl
# Carry .whl and ab. Argument: the call's seconds (default 580).
START=$(date +%s)
LIMIT=${1:-580}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout $(( LIMIT - 230 )) python3 scripts/ab_kernels.py --tree main=ab/main --tree new=ab/new --tree early=ab/early \
  --tree qpf=ab/qpf --rounds 3 --only 'fwd d128 (8x2k|4x4k|2x8k|1x16k) causal$|fwd d128 8x2k full' > $OUT/ab.log 2>&1
grep -B1 -A12 "after round" $OUT/ab.log | grep -E "after|case|graph" | tail -7
echo "ab $(( $(date +%s) - START )) s"
HF_FLASHPATCH_CACHE=/tmp/cT timeout $(( LIMIT - 20 - ($(date +%s) - START) )) python3 -m pytest -q -m gpu \
  -p no:cacheprovider tests/gpu/test_forward.py tests/gpu/test_forward_walks.py > $OUT/forward_tests.log 2>&1
tail -3 $OUT/forward_tests.log
echo "tests $(( $(date +%s) - START )) s"
for n in 2048 4096; do
  [ $(( LIMIT - ($(date +%s) - START) )) -gt 45 ] || break
  HF_FLASHPATCH_CACHE=/tmp/cTL PYTHONPATH=/tmp/site timeout 40 python3 results/2026-12-07_masked-walk-timeline/walk_timeline.py \
    ab/tl $n $OUT/raw_$n.npz > $OUT/timeline_$n.log 2>&1
  tail -7 $OUT/timeline_$n.log
done
echo "total $(( $(date +%s) - START )) s"
