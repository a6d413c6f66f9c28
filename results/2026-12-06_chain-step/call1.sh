#!/bin/bash
# For the next session (not run in session 51): the chained walk's steady step with its V wait, key-length test and
# boundary test computed ahead (tag s51-chain-step-pinned-draft), its chain and walk GPU tests, then an A/B of kernel
# time against main with an A/A control, and the draft with the chain up to 8192 keys (max_keys_8k.diff) at 2x8k.
# Prediction in PREDICTION.md. About 250 s.
# Before, on the development machine (carry .whl and ab):
#   mkdir -p ab/ab_main51 ab/ab_step ab/ab_step8k
#   git archive main cuda hf_flashpatch scripts | tar x -C ab/ab_main51
#   git archive s51-chain-step-pinned-draft cuda hf_flashpatch scripts | tar x -C ab/ab_step
#   cp -r ab/ab_step/. ab/ab_step8k
#   (cd ab/ab_step8k && patch -p1 < ../../results/2026-12-06_chain-step/max_keys_8k.diff)
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
(cd ab/ab_step && PYTHONPATH=/tmp/site HF_FLASHPATCH_CACHE=/tmp/cs timeout 200 python3 -m pytest -q \
  -p no:cacheprovider ../../tests/gpu/test_forward_chained_walk.py ../../tests/gpu/test_forward_walks.py) \
  > $OUT/step_tests.log 2>&1
echo "== step tests: $(grep -E 'passed|failed|error' $OUT/step_tests.log | tail -1)"
grep -E "^(FAILED|ERROR)" $OUT/step_tests.log | head -5
timeout 240 python3 scripts/ab_kernels.py --tree main=ab/ab_main51 --tree step=ab/ab_step \
  --tree main_again=ab/ab_main51 --tree step8k=ab/ab_step8k --rounds 3 --only "^fwd d128 (8x2k|4x4k|2x8k) full$" \
  > $OUT/ab_step.log 2>&1
grep -A8 "after round 3" $OUT/ab_step.log
echo "total $(( $(date +%s) - START )) s"
