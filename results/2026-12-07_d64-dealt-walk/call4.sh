#!/bin/bash
# Call 4 (the committed tree): the forward walks' GPU tests again (the hand-made tables now shared by the masked and
# unmasked tests), the shipped-cubin manifest rewritten with this machine's cuobjdump (in the background), then issue
# 14's forward rows against cuDNN, sustained (d128 and d64, 2k-16k, full and causal). Carry .whl.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export PATH=$PATH:/usr/local/cuda/bin:$(python3 -c "import triton,os;print(os.path.dirname(triton.__file__))" 2>/dev/null)/backends/nvidia/bin
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
(python3 scripts/check_shipped_cubins.py --write $OUT/shipped_cubins.json --jobs 8 > $OUT/manifest.log 2>&1) &
HF_FLASHPATCH_CACHE=/tmp/cT timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward_walks.py \
  > $OUT/walks_tests.log 2>&1; tail -2 $OUT/walks_tests.log
timeout 330 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 --seqlens 2048 4096 8192 16384 \
  --parts forward > $OUT/sustained.log 2>&1
grep -E "forward" $OUT/sustained.log
wait
tail -3 $OUT/manifest.log
echo "total $(( $(date +%s) - START )) s"
