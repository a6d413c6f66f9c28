#!/bin/bash
# session 29 call 3: the rest of the GPU suite on the final tree, the peer benchmarks, the fine-tune rows
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .ab/s29c3.sh $OUT/
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/cA timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "not varlen and not query_rows and not persistent" > $OUT/tests_forward_core.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cB timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "varlen or query_rows or persistent" > $OUT/tests_forward_varlen_q_walk.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cC timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_training.py tests/gpu/test_value_head_dim_gpu.py > $OUT/tests_training_vhd.log 2>&1 &
wait
HF_FLASHPATCH_CACHE=/tmp/cD timeout 160 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_sinks_gpu.py tests/gpu/test_backend_gpu.py tests/gpu/test_compile_gpu.py > $OUT/tests_sinks_backend_compile.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cE timeout 160 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_architectures_gpu.py tests/gpu/test_build_gpu.py tests/gpu/test_paged_generate.py > $OUT/tests_architectures_build_paged.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cF timeout 160 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_decode.py tests/gpu/test_bad_tables.py > $OUT/tests_decode_tables.log 2>&1 &
wait
for f in $OUT/tests_*.log; do echo "$(basename $f): $(tail -1 $f)"; done
grep -hE "^FAILED|^ERROR" $OUT/tests_*.log | head -8
echo "tests $(( $(date +%s) - T0 )) s"
timeout 100 python scripts/bench_forward.py --quick > $OUT/bench_forward.log 2>&1
grep -E "^ours/sdpa_cudnn" $OUT/bench_forward.log
timeout 90 python scripts/bench_backward.py --quick --only kernels --head-dims 128,64 > $OUT/bench_backward.log 2>&1
grep -E "^ours/sdpa_cudnn " $OUT/bench_backward.log
echo "bench $(( $(date +%s) - T0 )) s"
timeout 100 python scripts/bench_backward.py --only training > $OUT/bench_training.log 2>&1
grep -E "llama" $OUT/bench_training.log | head -8
echo "total $(( $(date +%s) - T0 )) s"
