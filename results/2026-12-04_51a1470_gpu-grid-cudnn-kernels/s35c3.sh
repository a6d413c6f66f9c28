#!/bin/bash
# session 35 call 3: which kernels cuDNN runs at the issue-14 shapes (names, grid, block, registers, shared memory)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .ab/s35c3.sh .ab/cudnn_kernels.py $OUT/
timeout 120 python .ab/cudnn_kernels.py 2>&1 | tee $OUT/cudnn_kernels.log | cut -c1-400
# then the whole GPU test grid at this tree (aa3112e's host logic was CPU-checked only in session 34)
T0=$(date +%s)
run() { local name=$1; shift; HF_FLASHPATCH_CACHE=/tmp/c_$name timeout 220 python -m pytest -q -m gpu -p no:cacheprovider "$@" > $OUT/tests_$name.log 2>&1; echo "rc=$?" >> $OUT/tests_$name.log; }
run forward tests/gpu/test_forward.py &
run backward_core tests/gpu/test_backward.py -k "not varlen" &
run backward_varlen tests/gpu/test_backward.py -k varlen &
run training_vdim_sinks tests/gpu/test_training.py tests/gpu/test_value_head_dim_gpu.py tests/gpu/test_sinks_gpu.py &
run decode_backend tests/gpu/test_decode.py tests/gpu/test_bad_tables.py tests/gpu/test_paged_generate.py tests/gpu/test_build_gpu.py tests/gpu/test_compile_gpu.py tests/gpu/test_backend_gpu.py tests/gpu/test_architectures_gpu.py &
wait
for f in $OUT/tests_*.log; do echo "$(basename $f): $(grep -E 'passed|failed|error' $f | tail -1) $(tail -1 $f)"; done
grep -hE "^FAILED|^ERROR" $OUT/tests_*.log | head -12
echo "grid $(( $(date +%s) - T0 )) s"
