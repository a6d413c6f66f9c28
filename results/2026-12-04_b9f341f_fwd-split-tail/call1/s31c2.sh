#!/bin/bash
# session 31 call 2: the split tail of the unmasked walk: forward grid, A/B with an A/A pair, d128 full vs cuDNN
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT; cp .ab/s31c2.sh .ab/vs_cudnn_d128.py $OUT/
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/cA timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "not varlen and not query_rows and not persistent" > $OUT/tests_forward_core.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cB timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "varlen or query_rows or persistent" > $OUT/tests_forward_varlen_q_walk.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cC timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_value_head_dim_gpu.py tests/gpu/test_compile_gpu.py > $OUT/tests_vhd_compile.log 2>&1 &
wait
for f in $OUT/tests_*.log; do echo "$(basename $f): $(tail -1 $f)"; done
grep -hE "^FAILED|^ERROR" $OUT/tests_*.log | head -8
echo "tests $(( $(date +%s) - T0 )) s"
timeout 260 python scripts/ab_kernels.py --tree base=$ROOT/.ab/base_tree --tree base_again=$ROOT/.ab/base_tree --tree tail=$ROOT --only "^fwd d128 (8x2k full|4x4k full|1x16k full|4x4k causal)|^fwd d192|^fwd d64 4x4k full" --rounds 3 --repeats 20 > $OUT/ab_fwd.log 2>&1
grep -E "after round|graph" $OUT/ab_fwd.log | tail -8
echo "ab $(( $(date +%s) - T0 )) s"
timeout 100 python .ab/vs_cudnn_d128.py > $OUT/vs_cudnn.log 2>&1
tail -5 $OUT/vs_cudnn.log
echo "total $(( $(date +%s) - T0 )) s"
