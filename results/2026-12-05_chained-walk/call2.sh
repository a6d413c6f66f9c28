#!/bin/bash
# session 46, call 2: the chained walk (its step with the copy step and the finished softmax set at a work's start)
# tested again, then sustained timing of the unmasked d128 shapes against cuDNN in one process, in turns.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
timeout 150 python3 -m pytest -q -x tests/gpu/test_forward_chained_walk.py > $OUT/tests_chain.log 2>&1; tail -2 $OUT/tests_chain.log
timeout 300 python3 results/2026-12-05_chained-walk/sustained_shapes.py --seconds 0.6 --rounds 5 > $OUT/sustained_shapes.log 2>&1
cat $OUT/sustained_shapes.log | tail -6
echo "total $(( $(date +%s) - START )) s"
