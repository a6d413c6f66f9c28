#!/bin/bash
# session 46, call 1: the chained walk's GPU tests, the unmasked d128 forward tests with it shipped, and the A/B of
# kernel time over three trees (base = main 42ac82d, n160 = 160-key tiles work by work, chain = this tree). Before:
# git archive 42ac82d cuda hf_flashpatch scripts | tar x -C ab_base; the same of HEAD into ab_n160, its
# HOPPER_SHAPES (128, False) on block_n=160 (both untracked, so carried).
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
timeout 150 python3 -m pytest -q -x tests/gpu/test_forward_chained_walk.py > $OUT/tests_chain.log 2>&1; tail -3 $OUT/tests_chain.log
timeout 100 python3 -m pytest -q tests/gpu/test_forward.py -k "(matches_oracle and 128 and full) or multicast or output_boxes or varlen or strided or graph or compile" > $OUT/tests_forward.log 2>&1; tail -3 $OUT/tests_forward.log
echo "tests $(( $(date +%s) - START )) s"
timeout 330 python3 scripts/ab_kernels.py --tree base=ab_base --tree n160=ab_n160 --tree chain=. --rounds 3 --only "^fwd d128 (8x2k|4x4k|2x8k|1x16k) full$|^fwd d128 8x2k causal$" > $OUT/ab_chain.log 2>&1
tail -12 $OUT/ab_chain.log
echo "total $(( $(date +%s) - START )) s"
