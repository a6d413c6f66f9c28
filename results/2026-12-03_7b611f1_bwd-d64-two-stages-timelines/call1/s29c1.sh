#!/bin/bash
# session 29 call 1: the d64 two-stage backward draft (grid + A/B), block / work timelines
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT; cp .ab/s29c1.sh .ab/tl.py $OUT/
T0=$(date +%s)
cd $ROOT/.ab/d64_tree
HF_FLASHPATCH_CACHE=/tmp/cA PYTHONPATH=/tmp/site:$ROOT/.ab/d64_tree timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_backward.py -k "not varlen and not window" > $OUT/tests_backward_core.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cB PYTHONPATH=/tmp/site:$ROOT/.ab/d64_tree timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_backward.py -k "varlen or window" > $OUT/tests_backward_varlen_window.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cC PYTHONPATH=/tmp/site:$ROOT/.ab/d64_tree timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_training.py > $OUT/tests_training.log 2>&1 &
wait
cd $ROOT
for f in $OUT/tests_*.log; do echo "$(basename $f): $(tail -1 $f)"; done
grep -hE "^FAILED|^ERROR" $OUT/tests_*.log | head -8
echo "tests $(( $(date +%s) - T0 )) s"
timeout 150 python scripts/ab_kernels.py --tree main=$ROOT --tree d64=$ROOT/.ab/d64_tree --only "^bwd d64" --rounds 3 --repeats 20 > $OUT/ab_bwd_d64.log 2>&1
tail -6 $OUT/ab_bwd_d64.log
echo "ab $(( $(date +%s) - T0 )) s"
cd $ROOT/.ab/tl_tree
HF_FLASHPATCH_CACHE=/tmp/cT PYTHONPATH=/tmp/site:$ROOT/.ab/tl_tree timeout 150 python $ROOT/.ab/tl.py > $OUT/timelines.log 2>&1
cd $ROOT
grep -vE "^\s*$" $OUT/timelines.log | tail -45
echo "total $(( $(date +%s) - T0 )) s"
