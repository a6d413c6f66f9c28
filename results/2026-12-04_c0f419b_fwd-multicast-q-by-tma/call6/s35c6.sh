#!/bin/bash
# session 35 call 6: Q by the TMA under the K/V multicast at unmasked d128 (probe tree .ab/qtma) against HEAD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT; cp .ab/s35c6.sh $OUT/
T0=$(date +%s)
timeout 330 python scripts/ab_kernels.py --tree base=$ROOT/.ab/base --tree qtma=$ROOT/.ab/qtma --only "^fwd d128 (8x2k|4x4k|1x16k)" --rounds 3 --repeats 20 > $OUT/ab_fwd.log 2>&1
grep -A14 "after round" $OUT/ab_fwd.log | grep -E "after round|graph" | tail -21
echo "total $(( $(date +%s) - T0 )) s"
