#!/bin/bash
# Call 1: overhead_probe.py (a masked work's cost beside its key tiles, d128 and d64). Carry .whl.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 python3 results/2026-12-07_work-overhead-probe/overhead_probe.py --rounds 3 > $OUT/overhead_probe.log 2>&1
cat $OUT/overhead_probe.log
echo "total $(( $(date +%s) - START )) s"
