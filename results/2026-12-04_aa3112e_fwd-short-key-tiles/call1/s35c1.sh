#!/bin/bash
# session 35 call 1: short-key 128-key multicast tiles: forward GPU tests, A/B against aa3112e (x: 4096, x8k: 8192)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT; cp .ab/s35c1.sh $OUT/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/cX timeout 220 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py > $OUT/tests_forward.log 2>&1
echo "forward tests: $(tail -1 $OUT/tests_forward.log)  ($(( $(date +%s) - T0 )) s)"
grep -hE "^FAILED|^ERROR" $OUT/tests_forward.log | head -8
timeout 300 python scripts/ab_kernels.py --tree base=$ROOT/.ab/base --tree x=$ROOT --tree x8k=$ROOT/.ab/x8k --only "^fwd d128 (4x4k|8x2k|2x8k|1x16k) full" --rounds 4 --repeats 20 > $OUT/ab_fwd.log 2>&1
grep -E "after round|graph" $OUT/ab_fwd.log | tail -12
echo "total $(( $(date +%s) - T0 )) s"
