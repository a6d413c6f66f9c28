#!/bin/bash
# session 33 call 7: one warp-uniform warpgroup index in the Hopper backward: the d64/d128 backward tests, then A/B
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT; cp .ab/s33c7.sh $OUT/
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/cA timeout 110 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_backward.py -k "not varlen" -x > $OUT/tests_backward_core.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cB timeout 110 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_backward.py -k "varlen" -x > $OUT/tests_backward_varlen.log 2>&1 &
wait
for f in $OUT/tests_*.log; do echo "$(basename $f): $(tail -1 $f)"; done
grep -hE "^FAILED|^ERROR" $OUT/tests_*.log | head -8
echo "tests $(( $(date +%s) - T0 )) s"
timeout 190 python scripts/ab_kernels.py --tree base=$ROOT/.ab/base_tree --tree one_wg=$ROOT --only "^bwd d(128 (4x4k|8x2k)|64 )" --rounds 3 --repeats 20 > $OUT/ab_bwd.log 2>&1
grep -E "after round|graph" $OUT/ab_bwd.log | tail -8
echo "total $(( $(date +%s) - T0 )) s"
