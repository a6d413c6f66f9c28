#!/bin/bash
# session 27 call 5: the rest of the GPU suite on the final tree (bc78496; forward and backward grids ran in calls 3-4)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
cp .ab/s27c5.sh $OUT/
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/cA timeout 230 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_training.py tests/gpu/test_value_head_dim_gpu.py tests/gpu/test_sinks_gpu.py > $OUT/tests_training_vhd_sinks.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cB timeout 230 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_backend_gpu.py tests/gpu/test_architectures_gpu.py tests/gpu/test_compile_gpu.py tests/gpu/test_build_gpu.py tests/gpu/test_paged_generate.py > $OUT/tests_backend_compile_paged.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cC timeout 230 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_decode.py tests/gpu/test_bad_tables.py > $OUT/tests_decode_tables.log 2>&1 &
wait
for f in $OUT/tests_*.log; do echo "$(basename $f): $(tail -1 $f)"; done
grep -hE "^FAILED|^ERROR" $OUT/tests_*.log | head -8
echo "total $(( $(date +%s) - T0 )) s"
