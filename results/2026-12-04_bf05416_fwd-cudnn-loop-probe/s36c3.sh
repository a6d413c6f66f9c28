#!/bin/bash
# session 36 call 3 (a probe): cuDNN's loop on our unmasked d128 body: 128-key tiles in three stages, no intra-warpgroup
# overlap, with (.ab/pp) and without (.ab/nopp) the two math warpgroups taking turns at their softmax, against main
# (.ab/x: the output boxes) and main before them (.ab/base)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT; cp .ab/s36c3.sh $OUT/
T0=$(date +%s)
PYTHONPATH=/tmp/site:$ROOT/.ab/pp HF_FLASHPATCH_CACHE=/tmp/c_pp timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "output_boxes or multicast or (matches_oracle and 128)" -x > $OUT/tests_pp.log 2>&1
echo "pp tests rc=$? $(tail -1 $OUT/tests_pp.log) $(( $(date +%s) - T0 )) s"
grep -E "^FAILED|^ERROR" $OUT/tests_pp.log | head -5
export PYTHONPATH=/tmp/site:$ROOT
T0=$(date +%s)
timeout 330 python scripts/ab_kernels.py --tree main=$ROOT/.ab/x --tree before=$ROOT/.ab/base --tree nopp=$ROOT/.ab/nopp --tree pp=$ROOT/.ab/pp --only "^fwd d128 (8x2k|4x4k full|2x8k|1x16k full)" --rounds 3 --repeats 20 > $OUT/ab_fwd.log 2>&1
grep -A12 "after round" $OUT/ab_fwd.log | grep -E "after round|graph" | tail -18
echo "ab $(( $(date +%s) - T0 )) s"
