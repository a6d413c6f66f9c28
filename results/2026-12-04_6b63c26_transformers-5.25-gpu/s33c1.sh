#!/bin/bash
# session 33 call 1: the transformers-facing GPU tests under the newest transformers (5.25.0, carried in .tf525)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/tf525 .tf525/*.whl 2>/dev/null
export PYTHONPATH=/tmp/tf525:/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .ab/s33c1.sh $OUT/
T0=$(date +%s)
python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
git log --oneline -1 2>/dev/null || echo "commit: $HF_FLASHPATCH_COMMIT"
timeout 500 python -m pytest -q -p no:cacheprovider tests/gpu/test_backend_gpu.py tests/gpu/test_architectures_gpu.py \
  tests/gpu/test_compile_gpu.py tests/gpu/test_paged_generate.py tests/gpu/test_sinks_gpu.py \
  tests/gpu/test_value_head_dim_gpu.py tests/gpu/test_bad_tables.py tests/gpu/test_training.py -rs > $OUT/gpu_tests_525.log 2>&1
echo "pytest rc=$?"
grep -E "passed|failed|FAILED|ERROR" $OUT/gpu_tests_525.log | tail -15
echo "total $(( $(date +%s) - T0 )) s"
