#!/bin/bash
# session 35 call 5: the backward test that read the removed per-module warning set, and the other fallback / bad-input GPU tests
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .ab/s35c5.sh $OUT/
HF_FLASHPATCH_CACHE=/tmp/c5 timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_backward.py -k "fallback or fp32 or unsupported or bad or refuse" > $OUT/tests_backward_fallback.log 2>&1
echo "rc=$?" >> $OUT/tests_backward_fallback.log
tail -3 $OUT/tests_backward_fallback.log
