#!/bin/bash
# session 23 call 1: clock64 timeline of the wgmma backward step as it is now (scratch instrumentation in .ab/tl)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT
T0=$(date +%s)
cd $ROOT/.ab/tl && HF_FLASHPATCH_CACHE=/tmp/c_tl PYTHONPATH=/tmp/site:$ROOT/.ab/tl timeout 400 python timeline.py > $OUT/timeline.log 2>&1
cat $OUT/timeline.log | grep -v Warn | tail -90
echo "total $(( $(date +%s) - T0 )) s"
