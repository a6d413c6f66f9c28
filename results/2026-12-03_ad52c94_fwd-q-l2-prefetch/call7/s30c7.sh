#!/bin/bash
# session 30 call 7: Q by a TMA box issued by the math warpgroup (no Q thread): forward grids, A/B against ad52c94
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT; cp .ab/s30c7.sh $OUT/
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/cA timeout 75 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "not varlen and not query_rows and not persistent" > $OUT/tests_forward_core.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cB timeout 75 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "varlen or query_rows or persistent" > $OUT/tests_forward_varlen_q_walk.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cC timeout 75 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_value_head_dim_gpu.py -k "192" > $OUT/tests_vhd192.log 2>&1 &
wait
for f in $OUT/tests_*.log; do echo "$(basename $f): $(tail -1 $f)"; done
grep -hE "^FAILED|^ERROR" $OUT/tests_*.log | head -8
echo "tests $(( $(date +%s) - T0 )) s"
timeout 80 python scripts/ab_kernels.py --tree base=$ROOT/.ab/base_tree --tree qbox=$ROOT --only "^fwd d128 (8x2k full|1x16k full)|^fwd d192" --rounds 2 --repeats 20 > $OUT/ab_fwd.log 2>&1
grep -E "after round|graph" $OUT/ab_fwd.log | tail -8
echo "total $(( $(date +%s) - T0 )) s"
