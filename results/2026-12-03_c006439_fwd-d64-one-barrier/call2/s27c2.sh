#!/bin/bash
# session 27 call 2: c006439's tables against cuDNN in one run: forward and backward kernels (--quick), the
# 16-layer fine-tune (one 4k / one 16k sequence, packed row).
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
cp .ab/s27c2.sh $OUT/
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/cA timeout 250 python scripts/bench_backward.py --only training,packed > $OUT/bench_training16.log 2>&1
grep -E '^(sdpa|hfpatch)' $OUT/bench_training16.log
echo "training took $(( $(date +%s) - T0 )) s"
HF_FLASHPATCH_CACHE=/tmp/cA timeout 100 python scripts/bench_forward.py --quick > $OUT/bench_forward_quick.log 2>&1
grep -E "ours/sdpa_cudnn" $OUT/bench_forward_quick.log
HF_FLASHPATCH_CACHE=/tmp/cA timeout 110 python scripts/bench_backward.py --quick --only kernels --head-dims 128,64 > $OUT/bench_backward_quick.log 2>&1
grep -E "ours/sdpa_cudnn" $OUT/bench_backward_quick.log
echo "total $(( $(date +%s) - T0 )) s"
