#!/bin/bash
# For the next session (not run in session 50): the chained walk's next Q by per-warp TMA boxes (tag
# s50-chain-q-boxes-draft), its GPU tests and an A/B against main with an A/A control (prediction at the end of
# PREDICTION.md), then main's sustained table (about 330 s in all; on an H200 if one comes).
# Before, on the development machine (carry .whl and ab):
#   mkdir -p ab/ab_main50 ab/ab_qbox && git archive main cuda hf_flashpatch scripts | tar x -C ab/ab_main50
#   git archive s50-chain-q-boxes-draft cuda hf_flashpatch scripts | tar x -C ab/ab_qbox
#   cp -r ab/ab_qbox ab/ab_qbox_turns
#   (cd ab/ab_qbox_turns && patch -p1 < ../../results/2026-12-06_chain-pingpong/qbox_turns.diff)
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
# correctness first: the chain's tests and the forward walks' equalities on the draft's package
(cd ab/ab_qbox && PYTHONPATH=/tmp/site HF_FLASHPATCH_CACHE=/tmp/cq timeout 240 python3 -m pytest -q -p no:cacheprovider \
  ../../tests/gpu/test_forward_chained_walk.py ../../tests/gpu/test_forward_walks.py) > $OUT/qbox_tests.log 2>&1
echo "== qbox tests: $(grep -E 'passed|failed|error' $OUT/qbox_tests.log | tail -1)"
grep -E "^(FAILED|ERROR)" $OUT/qbox_tests.log | head -5
timeout 240 python3 scripts/ab_kernels.py --tree main=ab/ab_main50 --tree qbox=ab/ab_qbox --tree main_again=ab/ab_main50 \
  --tree qbox_turns=ab/ab_qbox_turns \
  --rounds 3 --only "^fwd d128 (8x2k|4x4k|2x8k) full$" > $OUT/ab_qbox.log 2>&1
grep -A5 "after round 3" $OUT/ab_qbox.log
# main's issue-14 table on this card (the H200 has run neither the chained walk nor the turns)
timeout 200 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 > $OUT/bench_sustained.log 2>&1
grep -E "forward|backward" $OUT/bench_sustained.log
echo "total $(( $(date +%s) - START )) s"
