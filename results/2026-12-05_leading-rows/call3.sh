#!/bin/bash
# session 45: call 2's grid failed three windowed d128 / 192-128 cases at seqlen 700 (batched with a lead against
# varlen, bit for bit); debug_window.py says which rows differ and whether any is off the oracle. Then the GPU tests on
# transformers 5.25, whose huggingface_hub needs httpx2 (carried in .tfnew/hub_deps.tgz: `tar czf` of the development
# machine's site-packages httpx2 httpcore2 truststore anyio h11 idna with their dist-info folders; .tfnew otherwise as
# call2.sh's header says).
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
timeout 150 python3 results/2026-12-05_leading-rows/debug_window.py 2>&1 | tee $OUT/debug_window.log | grep -v "^$"
mkdir -p /tmp/tfnew && for f in .tfnew/*.tgz; do tar xzf $f -C /tmp/tfnew; done
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/tfnew .tfnew/*.whl 2>/dev/null
NEW=/tmp/tfnew:/tmp/site:$PWD
if PYTHONPATH=$NEW python3 -c "import transformers; print('newest transformers', transformers.__version__); from transformers import AutoModelForCausalLM" 2>&1 | tail -3; then
  T0=$(date +%s)
  PYTHONPATH=$NEW HF_FLASHPATCH_CACHE=/tmp/c525 timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/gpu/test_paged_generate.py tests/gpu/test_compile_gpu.py tests/gpu/test_backend_gpu.py \
    tests/gpu/test_architectures_gpu.py tests/gpu/test_bidirectional_gpu.py > $OUT/tests_525.log 2>&1
  echo "rc=$?" >> $OUT/tests_525.log
  echo "5.25: $(grep -E 'passed|failed' $OUT/tests_525.log | tail -1) $(tail -1 $OUT/tests_525.log) $(( $(date +%s) - T0 )) s"
  grep -E "^(FAILED|ERROR)" $OUT/tests_525.log | head -20
fi
