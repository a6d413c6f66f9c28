#!/bin/bash
# session 44's last try, on the device time left after the refusals (under three minutes of run): the two grid groups
# that call 1's fault cut short (the forward, the v head dims), logs written straight to $OUT so a cut run returns them
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
T0=$(date +%s)
(HF_FLASHPATCH_CACHE=/tmp/c_fwd timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py \
  > $OUT/tests_forward.log 2>&1; echo "rc=$?" >> $OUT/tests_forward.log) &
(HF_FLASHPATCH_CACHE=/tmp/c_vd timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/gpu/test_value_head_dim_gpu.py > $OUT/tests_vdim.log 2>&1; echo "rc=$?" >> $OUT/tests_vdim.log) &
wait
for f in $OUT/tests_*.log; do echo "$(basename $f): $(grep -E 'passed|failed' $f | tail -1) $(tail -1 $f)"; done
grep -hE "^(FAILED|ERROR)" $OUT/tests_*.log | head -20
echo "groups $(( $(date +%s) - T0 )) s"
