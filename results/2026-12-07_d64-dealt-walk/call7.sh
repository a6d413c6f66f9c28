#!/bin/bash
# Call 7 (the final commit): the forward walks' GPU tests and the work-list / schedule tests with a GPU present.
# Carry .whl.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
git log -1 --format=%h 2>/dev/null
HF_FLASHPATCH_CACHE=/tmp/cT timeout 250 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_forward_walks.py \
  tests/test_work_list.py tests/test_kernel_scalars.py > $OUT/tests.log 2>&1; tail -2 $OUT/tests.log
