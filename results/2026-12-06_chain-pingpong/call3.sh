#!/bin/bash
# Session 50, call 3: the issue-14 table (scripts/bench_sustained.py: ours / cuDNN, sustained, every forward and
# backward cell) on this tree: the warpgroups' turns on the masked d128 build only (192/128 measured no gain in call 2
# and keeps its SASS), every other kernel as main's.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 400 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 > $OUT/bench_sustained.log 2>&1
grep -E "forward|backward" $OUT/bench_sustained.log
echo "total $(( $(date +%s) - START )) s"
