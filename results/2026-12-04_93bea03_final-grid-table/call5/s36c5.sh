#!/bin/bash
# session 36 call 5: the Q-by-TMA test mended (its forced shape drops the output boxes), with the boxes' and the
# multicast's tests, at the final tree
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .ab/s36c5.sh $OUT/
T0=$(date +%s)
timeout 240 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "query_rows_by_the_tma or output_boxes or multicast" > $OUT/tests_forward.log 2>&1
echo "rc=$? $(tail -1 $OUT/tests_forward.log) $(( $(date +%s) - T0 )) s"
grep -E "^FAILED|^ERROR" $OUT/tests_forward.log | head -5
