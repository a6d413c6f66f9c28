#!/bin/bash
# For the next session (not run in session 50), after call5.sh: causal d128 at 2k, the masked d128 shape on two-stage
# 128-key tiles with the output boxes (the math warps copy Q), with the warpgroups' turns (masked_boxes.diff on main),
# against main's three stages with Q by the TMA; its forward tests first. Prediction at the end of PREDICTION.md.
# Before, on the development machine (carry .whl and ab):
#   mkdir -p ab/ab_main50 ab/ab_masked_boxes && git archive main cuda hf_flashpatch scripts | tar x -C ab/ab_main50
#   git archive main cuda hf_flashpatch scripts | tar x -C ab/ab_masked_boxes
#   (cd ab/ab_masked_boxes && patch -p1 < ../../results/2026-12-06_chain-pingpong/masked_boxes.diff)
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
(cd ab/ab_masked_boxes && PYTHONPATH=/tmp/site HF_FLASHPATCH_CACHE=/tmp/cm timeout 240 python3 -m pytest -q \
  -p no:cacheprovider ../../tests/gpu/test_forward.py ../../tests/gpu/test_forward_walks.py) > $OUT/masked_boxes_tests.log 2>&1
echo "== masked_boxes tests: $(grep -E 'passed|failed|error' $OUT/masked_boxes_tests.log | tail -1)"
grep -E "^(FAILED|ERROR)" $OUT/masked_boxes_tests.log | head -5
timeout 240 python3 scripts/ab_kernels.py --tree main=ab/ab_main50 --tree boxes=ab/ab_masked_boxes \
  --tree main_again=ab/ab_main50 --rounds 3 --only "^fwd d128 (8x2k|4x4k|1x16k) causal$" > $OUT/ab_masked_boxes.log 2>&1
grep -A5 "after round 3" $OUT/ab_masked_boxes.log
echo "total $(( $(date +%s) - START )) s"
