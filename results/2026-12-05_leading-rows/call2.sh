#!/bin/bash
# session 44: one call, since the device refused most starts: the GPU grid on the fixed tree (no leading rows with
# output boxes), the transformers-version-dependent GPU tests on the newest transformers (5.25, carried as .tfnew),
# then, while the call's time allows, the sustained table against cuDNN and the 16-layer fine-tune at one 16k sequence.
# Carry .whl (../shared/gpu/stage.sh) and .tfnew: transformers-5.25.tgz and hub.tgz (`tar czf` of the development
# machine's site-packages/transformers and huggingface_hub with their dist-info folders, no __pycache__), plus the
# tokenizers 0.23.2 and safetensors 0.8.0 wheels.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
bash scripts/gpu_grid.sh $OUT 170 > $OUT/grid.log 2>&1; tail -25 $OUT/grid.log
mkdir -p /tmp/tfnew && tar xzf .tfnew/transformers-5.25.tgz -C /tmp/tfnew && tar xzf .tfnew/hub.tgz -C /tmp/tfnew
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/tfnew .tfnew/*.whl 2>/dev/null
NEW=/tmp/tfnew:/tmp/site:$PWD
if PYTHONPATH=$NEW python3 -c "import transformers; print('newest transformers', transformers.__version__); from transformers import AutoModelForCausalLM"; then
  T0=$(date +%s)
  PYTHONPATH=$NEW HF_FLASHPATCH_CACHE=/tmp/c525 timeout 110 python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/gpu/test_paged_generate.py tests/gpu/test_compile_gpu.py tests/gpu/test_backend_gpu.py \
    tests/gpu/test_architectures_gpu.py tests/gpu/test_bidirectional_gpu.py > $OUT/tests_525.log 2>&1
  echo "rc=$?" >> $OUT/tests_525.log
  echo "5.25: $(grep -E 'passed|failed' $OUT/tests_525.log | tail -1) $(tail -1 $OUT/tests_525.log) $(( $(date +%s) - T0 )) s"
  grep -E "^(FAILED|ERROR)" $OUT/tests_525.log | head -20
fi
T0=$(date +%s)
timeout 140 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 > $OUT/bench_sustained.log 2>&1
grep -E "forward|backward" $OUT/bench_sustained.log
echo "sustained $(( $(date +%s) - T0 )) s"
LEFT=$(( 570 - ($(date +%s) - START) ))
if [ $LEFT -gt 120 ]; then
  T0=$(date +%s)
  HF_FLASHPATCH_CACHE=/tmp/cA timeout $LEFT python3 scripts/bench_backward.py --only training > $OUT/bench_training16.log 2>&1
  grep -E '^(series|sdpa|hfpatch)' $OUT/bench_training16.log
  echo "training $(( $(date +%s) - T0 )) s"
else
  echo "training not run: $LEFT s left"
fi
