#!/bin/bash
# session 36 call 2: the output by per-warp TMA boxes (draft tree = the working tree, .ab/x) against main (.ab/base,
# A/A copy .ab/aa): the forward GPU tests on the draft, then the kernel-time A/B
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT; cp .ab/s36c2.sh $OUT/
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/c_tests timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "output_boxes or multicast or matches_oracle or strided or varlen or graph or compile" -x > $OUT/tests_forward.log 2>&1
echo "tests rc=$? $(tail -1 $OUT/tests_forward.log) $(( $(date +%s) - T0 )) s"
grep -E "^FAILED|^ERROR|Error" $OUT/tests_forward.log | head -5
T0=$(date +%s)
timeout 330 python scripts/ab_kernels.py --tree base=$ROOT/.ab/base --tree aa=$ROOT/.ab/aa --tree boxes=$ROOT/.ab/x --only "^fwd d128 (8x2k|4x4k|2x8k|1x16k)" --rounds 3 --repeats 20 > $OUT/ab_fwd.log 2>&1
grep -A14 "after round" $OUT/ab_fwd.log | grep -E "after round|graph" | tail -24
echo "ab $(( $(date +%s) - T0 )) s"
