#!/bin/bash
# Session 49: call 5 cut to what the device time left allows (about 250 s; the device refused most starts), the
# checks of what no GPU has run yet, side by side on one GPU:
# 1. main's new GPU test of packed rows past the last sequence (tests/gpu/test_bad_tables.py, past_the_last);
# 2. main's forward walk and chained-walk tests through the split helpers (tests/gpu/forward_checks.py);
# 3. the chain's GPU tests on tag s48-final-pv-issue-pv;
# 4. continuous batching on the GPU under transformers 5.21.1 (test_paged_generate.py).
# Carry .whl, ab and .tfnew (as call5.sh).
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
HF_FLASHPATCH_CACHE=/tmp/c1 timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_bad_tables.py \
  -k past_the_last > $OUT/padding_rows.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/c2 timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_forward_walks.py \
  tests/gpu/test_forward_chained_walk.py > $OUT/walks.log 2>&1 &
(cd ab/ab_final_pv && PYTHONPATH=/tmp/site HF_FLASHPATCH_CACHE=/tmp/c3 timeout 200 python3 -m pytest -q \
  -p no:cacheprovider ../../tests/gpu/test_forward_chained_walk.py) > $OUT/final_pv_tests.log 2>&1 &
mkdir -p /tmp/tf521 && tar xzf .tfnew/hub.tgz -C /tmp/tf521 && tar xzf .tfnew/hub_deps.tgz -C /tmp/tf521
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/tf521 .tfnew/transformers-5.21.1-*.whl \
  .tfnew/tokenizers-*.whl .tfnew/safetensors-*.whl 2>/dev/null
(export PYTHONPATH=/tmp/tf521:/tmp/site:$PWD HF_FLASHPATCH_CACHE=/tmp/c4
 python3 -c "import transformers; print('transformers', transformers.__version__)"
 timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_paged_generate.py) > $OUT/transformers_5_21.log 2>&1 &
wait
for log in padding_rows walks final_pv_tests transformers_5_21; do
  echo "== $log: $(grep -E 'passed|failed|error' $OUT/$log.log | tail -1)"
  grep -E "^(FAILED|ERROR)" $OUT/$log.log | head -5
done
head -1 $OUT/transformers_5_21.log
echo "total $(( $(date +%s) - START )) s"
