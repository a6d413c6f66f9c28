#!/bin/bash
# Session 55, call 5 (next_call.sh with test_forward_walks.py added, whose patch targets were renamed; about 480 s
# with the start): main's chain and split-round GPU tests (with the case of more query tiles a pair than CTAs, which has run
# only on the cursor draft), the step timelines of main (8x2k and 4x4k full) and of carry (8x2k), then an A/B of
# main, main2 (A/A) and carry over eight rounds at 8x2k and 4x4k full: call 2's three rounds could not tell carry's
# 0.977-0.992 from the A/A's 0.968-0.987.
# Make the trees first (ab/ is ignored by git):
#   rm -rf ab && mkdir -p ab/main && git archive HEAD cuda hf_flashpatch scripts | tar -x -C ab/main
#   cp -r ab/main ab/main2 && mkdir -p ab/carry && git archive s54-chain-carry-draft cuda hf_flashpatch scripts \
#     | tar -x -C ab/carry   (the tag's parent is a577dc2: rebase its one commit if main's cuda/ moved since)
#   cp -r ab/main ab/tl_main && cp -r ab/carry ab/tl_carry
#   python3 results/2026-12-06_chain-boundary-timeline/instrument.py ab/tl_main  (and ab/tl_carry)
# Carry .whl and ab.
START=$(date +%s)
DEADLINE=${DEADLINE:-470}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
PYTHONPATH=/tmp/site:$PWD HF_FLASHPATCH_CACHE=/tmp/c_main timeout 150 python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_forward_chained_walk.py tests/gpu/test_forward_split_tail.py \
  tests/gpu/test_forward_walks.py > $OUT/tests_main.log 2>&1
echo "== tests main: $(grep -E 'passed|failed|error' $OUT/tests_main.log | tail -1)"
grep -hE "^(FAILED|ERROR)" $OUT/tests_main.log | head -8
for run in "tl_main 2048" "tl_carry 2048" "tl_main 4096"; do
  set -- $run
  PYTHONPATH=/tmp/site HF_FLASHPATCH_CACHE=/tmp/c_$1 timeout 45 python3 \
    results/2026-12-05_chain-boundary/chain_timeline.py ab/$1 $2 > $OUT/timeline_$1_$2.log 2>&1
  echo "== $1 $2"; tail -30 $OUT/timeline_$1_$2.log | grep -vE "^ +([4-9]|1[0-1]|1[3-9]|2[0-4]) "
done
echo "timelines $(( $(date +%s) - START )) s"
LEFT=$(( DEADLINE - ($(date +%s) - START) ))
PYTHONPATH=/tmp/site:$PWD timeout $LEFT python3 scripts/ab_kernels.py --tree main=ab/main --tree main2=ab/main2 \
  --tree carry=ab/carry --rounds 8 --only "^fwd d128 (8x2k|4x4k) full$" > $OUT/ab.log 2>&1
grep -A5 "after round" $OUT/ab.log | tail -6
echo "total $(( $(date +%s) - START )) s"
