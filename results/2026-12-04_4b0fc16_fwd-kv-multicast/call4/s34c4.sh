#!/bin/bash
# session 34 call 4: K/V multicast as landed (co-residency asked, plain fallback): forward grid, A/B against 24448ec, sustained table
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT; cp .ab/s34c4.sh $OUT/
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/cX timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -x > $OUT/tests_forward.log 2>&1
echo "forward tests: $(tail -1 $OUT/tests_forward.log)  ($(( $(date +%s) - T0 )) s)"
grep -hE "^FAILED|^ERROR|Error" $OUT/tests_forward.log | head -5
timeout 240 python scripts/ab_kernels.py --tree base=$ROOT/.ab/base_tree --tree multicast=$ROOT --only "^fwd d128 (4x4k|8x2k|1x16k)" --rounds 4 --repeats 20 > $OUT/ab_fwd.log 2>&1
grep -E "after round|graph" $OUT/ab_fwd.log | tail -8
echo "ab done $(( $(date +%s) - T0 )) s"
timeout 160 python scripts/bench_sustained.py --seconds 0.6 --rounds 5 > $OUT/bench_sustained.log 2>&1
grep forward $OUT/bench_sustained.log
echo "total $(( $(date +%s) - T0 )) s"
