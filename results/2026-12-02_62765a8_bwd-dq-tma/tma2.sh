#!/bin/bash
# call 7 (session 21): graph A/B of the TMA dQ (working tree) against main (62765a8, carried in .ab/main_tree)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT
T0=$(date +%s)
timeout 250 python scripts/ab_kernels.py --tree main=$ROOT/.ab/main_tree --tree tma=$ROOT --only "^bwd " --rounds 2 --repeats 20 > $OUT/ab_bwd.log 2>&1
tail -10 $OUT/ab_bwd.log
echo "total $(( $(date +%s) - T0 )) s"
