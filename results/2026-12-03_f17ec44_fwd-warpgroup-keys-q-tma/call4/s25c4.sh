#!/bin/bash
# session 25 call 4: the tree to land (working tree: a producer thread of its own loads Q by the TMA for the d64
# shape only; each math warpgroup computes its own rows' key tiles) against base = main. GPU tests, A/B, bench.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT
cp .ab/s25c4.sh $OUT/
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/cA timeout 90 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "not varlen and not query_rows and not persistent" > $OUT/tests_forward_core.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cB timeout 90 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py tests/gpu/test_value_head_dim_gpu.py -k "varlen or query_rows or persistent or value" > $OUT/tests_forward_varlen_q_walk_vhd.log 2>&1 &
wait
echo "tests took $(( $(date +%s) - T0 )) s"
for f in $OUT/tests_*.log; do echo "$(basename $f): $(tail -1 $f)"; done
grep -hE "^FAILED|^ERROR" $OUT/tests_*.log | head -8
timeout 75 python scripts/ab_kernels.py --tree base=$ROOT/.ab/base_tree --tree final=$ROOT --only "^fwd d(128|192|64)" --rounds 2 --repeats 20 > $OUT/ab_fwd.log 2>&1
tail -12 $OUT/ab_fwd.log | grep graph
echo "total $(( $(date +%s) - T0 )) s"
