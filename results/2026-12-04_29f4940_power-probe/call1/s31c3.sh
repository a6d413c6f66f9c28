#!/bin/bash
# session 31 call 3: clock and power while ours / cuDNN run back to back (nvidia-smi), unchanged kernels (9238313)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .ab/s31c3.sh .ab/power_probe.py $OUT/
T0=$(date +%s)
timeout 240 python .ab/power_probe.py > $OUT/power_probe.log 2>&1
cat $OUT/power_probe.log | tail -16
echo "total $(( $(date +%s) - T0 )) s"
