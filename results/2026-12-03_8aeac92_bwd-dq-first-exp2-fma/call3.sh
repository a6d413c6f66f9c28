#!/bin/bash
# session 23 call 3: part of P^T's exp2 on the FMA pipe (exp2_on_fma), 2 / 3 / 4 of each 8 query chunks (trees e2,
# e3, e4), against 8aeac92 (.ab/base_tree); GPU tests on the working tree (3 of 8 at d64 and d128)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/cA timeout 240 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_backward.py -k "not varlen and not window" > $OUT/tests_backward_core.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cD timeout 240 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_backward.py -k "varlen or window" > $OUT/tests_backward_varlen_window.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cB timeout 240 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_value_head_dim_gpu.py tests/gpu/test_training.py tests/gpu/test_sinks_gpu.py > $OUT/tests_vhd_training_sinks.log 2>&1 &
wait
echo "tests took $(( $(date +%s) - T0 )) s"
for f in $OUT/tests_*.log; do echo "$(basename $f): $(tail -1 $f)"; done
grep -hE "^FAILED|^ERROR" $OUT/tests_*.log | head -8
timeout 330 python scripts/ab_kernels.py --tree base=$ROOT/.ab/base_tree --tree e2=$ROOT/.ab/e2 --tree e3=$ROOT/.ab/e3 --tree e4=$ROOT/.ab/e4 --only "^bwd d(64|128) 4x4k" --rounds 3 --repeats 20 > $OUT/ab_bwd.log 2>&1
tail -9 $OUT/ab_bwd.log
echo "total $(( $(date +%s) - T0 )) s"
