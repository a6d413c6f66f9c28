#!/bin/bash
# Planned for the next device session (not run), after call 4; about 300 s. Session 48's GPU checks:
# 1. the chain's GPU tests on tag s48-final-pv-issue-pv (the chained walk's last P V through issue_pv; the loop's SASS
#    unchanged but for branch targets): if they pass, land it and rewrite scripts/shipped_cubins.json;
# 2. main's new GPU test of packed rows past the last sequence (tests/gpu/test_bad_tables.py, past_the_last);
# 3. continuous batching on the GPU under transformers 5.21.1 (the 5.19-5.23 hand-over, fixed on the CPU in session
#    48; the device's own transformers is 5.17).
# Before, on the development machine (carry .whl, ab and .tfnew):
#   mkdir -p ab/ab_final_pv && git archive s48-final-pv-issue-pv cuda hf_flashpatch scripts | tar x -C ab/ab_final_pv
#   python3 -m pip download --no-deps transformers==5.21.1 -d .tfnew
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
# From inside the tree: `python -m` puts the working directory first on sys.path, so its hf_flashpatch is the one run.
(cd ab/ab_final_pv && PYTHONPATH=/tmp/site timeout 120 python3 -c "import hf_flashpatch; print(hf_flashpatch.__file__)" \
  && PYTHONPATH=/tmp/site timeout 120 python3 -m pytest -q -p no:cacheprovider ../../tests/gpu/test_forward_chained_walk.py) \
  > $OUT/final_pv_tests.log 2>&1; head -1 $OUT/final_pv_tests.log; tail -2 $OUT/final_pv_tests.log
timeout 120 python3 -m pytest -q tests/gpu/test_bad_tables.py -k past_the_last > $OUT/padding_rows.log 2>&1
tail -2 $OUT/padding_rows.log
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/tf521 .tfnew/transformers-5.21.1-*.whl
(export PYTHONPATH=/tmp/tf521:/tmp/site:$PWD; python3 -c "import transformers; print('transformers', transformers.__version__)"
 timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_paged_generate.py tests/gpu/test_backend_gpu.py) \
  > $OUT/transformers_5_21.log 2>&1
grep -E "transformers|passed|failed" $OUT/transformers_5_21.log | tail -3
echo "total $(( $(date +%s) - START )) s"
