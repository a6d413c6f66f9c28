#!/bin/bash
# Session 53, call 5 (the device time left: about 280 s with the start): the GPU grid's groups that run the masked
# forward through the backend (prefill, generate, training), side by side, on the final tree. Carry .whl.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
group() {  # name, pytest arguments (as scripts/gpu_grid.sh)
  local name=$1
  shift
  HF_FLASHPATCH_CACHE=/tmp/cache_$name timeout 130 python3 -m pytest -q -m gpu -p no:cacheprovider "$@" \
    > $OUT/tests_$name.log 2>&1
  echo "rc=$?" >> $OUT/tests_$name.log
}
group training_sinks tests/gpu/test_training.py tests/gpu/test_sinks_gpu.py &
group decode_backend tests/gpu/test_decode.py tests/gpu/test_bad_tables.py tests/gpu/test_paged_generate.py \
  tests/gpu/test_build_gpu.py tests/gpu/test_compile_gpu.py tests/gpu/test_backend_gpu.py \
  tests/gpu/test_architectures_gpu.py tests/gpu/test_bidirectional_gpu.py &
wait
for log in $OUT/tests_*.log; do echo "$(basename $log .log): $(grep -E 'passed|failed|error' $log | tail -1) $(tail -1 $log)"; done
grep -hE "^(FAILED|ERROR)" $OUT/tests_*.log | head -10
echo "total $(( $(date +%s) - START )) s"
