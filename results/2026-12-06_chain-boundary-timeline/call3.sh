#!/bin/bash
# Session 54, call 3: where the chained walk's work boundary goes now, and whether `carry` (tag
# s54-chain-boundary-divisions-draft without its round cursor) gains beyond the A/A. ab/main, ab/main2 = main;
# ab/carry = carry; ab/tl_main, ab/tl_carry = the same with instrument.py's clocks. The chain's and the split round's
# GPU tests on main's tree and on carry's, side by side; the step timelines at 8x2k full; then the A/B, up to five
# rounds in what is left of DEADLINE s. Carry .whl and ab.
START=$(date +%s)
DEADLINE=${DEADLINE:-300}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
TESTS="tests/gpu/test_forward_chained_walk.py tests/gpu/test_forward_split_tail.py"
PYTHONPATH=/tmp/site:$PWD HF_FLASHPATCH_CACHE=/tmp/c_main timeout 120 python3 -m pytest -q -p no:cacheprovider $TESTS \
  > $OUT/tests_main.log 2>&1 &
cp -r tests ab/carry/ && cp pyproject.toml ab/carry/
(cd ab/carry && PYTHONPATH=/tmp/site:$PWD HF_FLASHPATCH_CACHE=/tmp/c_carry timeout 120 python3 -m pytest -q \
  -p no:cacheprovider $TESTS > $OUT/tests_carry.log 2>&1) &
wait
for t in main carry; do echo "== tests $t: $(grep -E 'passed|failed|error' $OUT/tests_$t.log | tail -1)"; done
grep -hE "^(FAILED|ERROR)" $OUT/tests_*.log | head -8
echo "tests $(( $(date +%s) - START )) s"
for tree in tl_main tl_carry; do
  for seqlen in 2048; do
    PYTHONPATH=/tmp/site HF_FLASHPATCH_CACHE=/tmp/c_$tree timeout 60 python3 \
      results/2026-12-05_chain-boundary/chain_timeline.py ab/$tree $seqlen > $OUT/timeline_${tree}_$seqlen.log 2>&1
    echo "== $tree $seqlen"; tail -17 $OUT/timeline_${tree}_$seqlen.log | grep -vE "^ +([4-9]|1[0-9]|2[0-3]) "
  done
done
echo "timelines $(( $(date +%s) - START )) s"
LEFT=$(( DEADLINE - ($(date +%s) - START) ))
PYTHONPATH=/tmp/site:$PWD timeout $LEFT python3 scripts/ab_kernels.py --tree main=ab/main --tree main2=ab/main2 \
  --tree carry=ab/carry --rounds 5 --only "^fwd d128 (8x2k|4x4k) full$" > $OUT/ab.log 2>&1
grep -A5 "after round" $OUT/ab.log | tail -6
echo "total $(( $(date +%s) - START )) s"
