#!/bin/bash
# session 28 call 4: the rest of the GPU suite on the final tree, the fine-tune rows
# (backends in turns)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .ab/s28c4.sh $OUT/
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/cA timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_sinks_gpu.py tests/gpu/test_backend_gpu.py tests/gpu/test_compile_gpu.py > $OUT/tests_sinks_backend_compile.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cB timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_architectures_gpu.py tests/gpu/test_build_gpu.py tests/gpu/test_paged_generate.py > $OUT/tests_architectures_build_paged.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cC timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_decode.py tests/gpu/test_bad_tables.py > $OUT/tests_decode_tables.log 2>&1 &
wait
for f in $OUT/tests_*.log; do echo "$(basename $f): $(tail -1 $f)"; done
grep -hE "^FAILED|^ERROR" $OUT/tests_*.log | head -8
echo "tests $(( $(date +%s) - T0 )) s"
timeout 100 python scripts/bench_backward.py --only training > $OUT/bench_training.log 2>&1
grep -E "llama" $OUT/bench_training.log | head -8
echo "training $(( $(date +%s) - T0 )) s"
echo "total $(( $(date +%s) - T0 )) s"
