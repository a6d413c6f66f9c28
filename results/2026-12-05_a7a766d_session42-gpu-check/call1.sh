#!/bin/bash
# session 43 call 1: the GPU grid on a7a766d (session 42 changed Python only: masks, compiled routes, validation,
# continuous batching past head dim 256), on the device's transformers 5.17 and on the newest (5.25), then the host
# time of an eager generate (session 42 trimmed the decode call's checks on the CPU).
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
bash scripts/gpu_grid.sh $OUT/grid517 200
mkdir -p /tmp/tfnew && tar xzf .tfnew/transformers-5.25.tgz -C /tmp/tfnew && tar xzf .tfnew/hub.tgz -C /tmp/tfnew
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/tfnew .tfnew/*.whl 2>/dev/null
NEW=/tmp/tfnew:/tmp/site:$PWD
if PYTHONPATH=$NEW python3 -c "import transformers, sys; print('newest transformers', transformers.__version__); from transformers import AutoModelForCausalLM"; then
  T0=$(date +%s)
  PYTHONPATH=$NEW HF_FLASHPATCH_CACHE=/tmp/c525 timeout 230 python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/gpu/test_paged_generate.py tests/gpu/test_compile_gpu.py tests/gpu/test_backend_gpu.py \
    tests/gpu/test_architectures_gpu.py tests/gpu/test_bidirectional_gpu.py tests/gpu/test_training.py \
    tests/gpu/test_decode.py > $OUT/tests_525.log 2>&1
  echo "rc=$?" >> $OUT/tests_525.log
  echo "5.25: $(grep -E 'passed|failed' $OUT/tests_525.log | tail -1) $(tail -1 $OUT/tests_525.log) $(( $(date +%s) - T0 )) s"
  grep -E "^(FAILED|ERROR)" $OUT/tests_525.log | head -20
fi
HF_FLASHPATCH_CACHE=/tmp/c525 timeout 90 python3 scripts/profile_host.py --generate --top 12 > $OUT/profile_host.log 2>&1
grep -iE "tokens/s|ms|us" $OUT/profile_host.log | head -12
