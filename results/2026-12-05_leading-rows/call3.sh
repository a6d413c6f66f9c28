#!/bin/bash
# session 44 call 3 (after call 2's grid on the same warm machine): the sustained table against cuDNN and the
# 16-layer fine-tune at one 16k sequence on the merged tree, then the eager generate host profile
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
T0=$(date +%s)
timeout 150 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 > $OUT/bench_sustained.log 2>&1
grep -E "forward|backward" $OUT/bench_sustained.log
echo "sustained $(( $(date +%s) - T0 )) s"
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/cA timeout 200 python3 scripts/bench_backward.py --only training > $OUT/bench_training16.log 2>&1
grep -E '^(series|sdpa|hfpatch)' $OUT/bench_training16.log
echo "training $(( $(date +%s) - T0 )) s"
T0=$(date +%s)
timeout 90 python3 scripts/profile_host.py --generate --top 12 > $OUT/profile_generate.log 2>&1
head -30 $OUT/profile_generate.log
echo "profile $(( $(date +%s) - T0 )) s"
