#!/bin/bash
# session 27 call 1: c006439 (d64 one barrier per slot, 192/128 rescale after P V): GPU forward tests, A/B against
# b2730c3, the quick fine-tune bench.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT
cp .ab/s27c1.sh $OUT/
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/cA timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "not varlen and not query_rows and not persistent" > $OUT/tests_forward_core.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cB timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "varlen or query_rows or persistent" > $OUT/tests_forward_varlen_q_walk.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cC timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_value_head_dim_gpu.py tests/gpu/test_sinks_gpu.py > $OUT/tests_vhd_sinks.log 2>&1 &
wait
echo "tests took $(( $(date +%s) - T0 )) s"
for f in $OUT/tests_*.log; do echo "$(basename $f): $(tail -1 $f)"; done
grep -hE "^FAILED|^ERROR" $OUT/tests_*.log | head -8
timeout 270 python scripts/ab_kernels.py --tree main=$ROOT/.ab/main_tree --tree new=$ROOT --only "^fwd d(64|192)|^fwd d128 8x2k full" --rounds 3 --repeats 20 > $OUT/ab_fwd.log 2>&1
tail -14 $OUT/ab_fwd.log | grep graph
HF_FLASHPATCH_CACHE=/tmp/cA timeout 100 python scripts/bench_backward.py --quick --only training > $OUT/training_quick.log 2>&1
grep -E '^(sdpa|hfpatch)' $OUT/training_quick.log
echo "total $(( $(date +%s) - T0 )) s"
