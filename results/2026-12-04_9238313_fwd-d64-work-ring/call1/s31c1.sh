#!/bin/bash
# session 31 call 1: the d64 work ring on the masked walking build: forward grid, A/B with an A/A pair, d64 2k causal vs cuDNN
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT; cp .ab/s31c1.sh .ab/vs_cudnn.py $OUT/
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/cA timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "not varlen and not query_rows and not persistent" > $OUT/tests_forward_core.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cB timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "varlen or query_rows or persistent" > $OUT/tests_forward_varlen_q_walk.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cC timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_training.py tests/gpu/test_sinks_gpu.py > $OUT/tests_training_sinks.log 2>&1 &
wait
for f in $OUT/tests_*.log; do echo "$(basename $f): $(tail -1 $f)"; done
grep -hE "^FAILED|^ERROR" $OUT/tests_*.log | head -8
echo "tests $(( $(date +%s) - T0 )) s"
timeout 230 python scripts/ab_kernels.py --tree base=$ROOT/.ab/base_tree --tree base_again=$ROOT/.ab/base_tree --tree ring=$ROOT --only "^fwd d64 (8x2k causal|4x4k causal|1x16k causal)" --rounds 3 --repeats 20 > $OUT/ab_fwd_d64.log 2>&1
grep -E "after round|graph" $OUT/ab_fwd_d64.log | tail -6
echo "ab $(( $(date +%s) - T0 )) s"
timeout 100 python .ab/vs_cudnn.py > $OUT/vs_cudnn.log 2>&1
tail -4 $OUT/vs_cudnn.log
echo "total $(( $(date +%s) - T0 )) s"
