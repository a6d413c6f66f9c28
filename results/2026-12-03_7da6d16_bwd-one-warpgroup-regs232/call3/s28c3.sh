#!/bin/bash
# session 28 call 3: the d128 backward's next S^T under this step's dQ (kHScoresAhead): grid, A/B, bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT; cp .ab/s28c3.sh $OUT/
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/cA timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_backward.py -k "not varlen and not window" > $OUT/tests_backward_core.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cB timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_backward.py -k "varlen or window" > $OUT/tests_backward_varlen_window.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cC timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_training.py tests/gpu/test_value_head_dim_gpu.py > $OUT/tests_training_vhd.log 2>&1 &
wait
for f in $OUT/tests_*.log; do echo "$(basename $f): $(tail -1 $f)"; done
grep -hE "^FAILED|^ERROR" $OUT/tests_*.log | head -8
echo "tests $(( $(date +%s) - T0 )) s"
timeout 120 python scripts/ab_kernels.py --tree base=$ROOT/.ab/base_tree --tree new=$ROOT --only "^bwd d128|^bwd d64 8x2k" --rounds 3 --repeats 20 > $OUT/ab_bwd.log 2>&1
tail -5 $OUT/ab_bwd.log | grep graph
echo "ab $(( $(date +%s) - T0 )) s"
timeout 100 python scripts/bench_backward.py --quick --only kernels --head-dims 128 > $OUT/bench_backward_d128.log 2>&1
grep -E "^ours/sdpa_cudnn " $OUT/bench_backward_d128.log
echo "total $(( $(date +%s) - T0 )) s"
