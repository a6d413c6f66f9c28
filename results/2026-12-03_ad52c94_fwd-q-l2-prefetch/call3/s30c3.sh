#!/bin/bash
# session 30 call 3: forward work timeline per math warp (scratch instrumentation, .ab/tl_tree)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .ab/s30c3.sh .ab/tl2.py $OUT/; (cd .ab/tl_tree && git diff --no-index /dev/null /dev/null; true)
cd .ab/tl_tree && PYTHONPATH=/tmp/site:$PWD HF_FLASHPATCH_CACHE=/tmp/ctl timeout 300 python ../tl2.py > $OUT/timelines.log 2>&1
cat $OUT/timelines.log | tail -30
