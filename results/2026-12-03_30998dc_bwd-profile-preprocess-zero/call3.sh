#!/bin/bash
# session 24 call 3: where a backward's time goes (torch.profiler: ours and cuDNN at the bench's 16k-token shapes),
# and bwd_preprocess zeroing the dQ workspace (working tree) against bdebeca (.ab/base_tree)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT
cp .ab/call3.sh .ab/prof.py $OUT/
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/cA timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_backward.py -k "not varlen and not window" > $OUT/tests_backward_core.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cD timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_backward.py -k "varlen or window" > $OUT/tests_backward_varlen_window.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cB timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_value_head_dim_gpu.py tests/gpu/test_training.py tests/gpu/test_sinks_gpu.py > $OUT/tests_vhd_training_sinks.log 2>&1 &
wait
echo "tests took $(( $(date +%s) - T0 )) s"
for f in $OUT/tests_*.log; do echo "$(basename $f): $(tail -1 $f)"; done
grep -hE "^FAILED|^ERROR" $OUT/tests_*.log | head -8
HF_FLASHPATCH_CACHE=/tmp/cA timeout 120 python .ab/prof.py > $OUT/prof.log 2>&1
grep -E "^==|  (ours|sdpa_cudnn):|us  " $OUT/prof.log | head -70
timeout 200 python scripts/ab_kernels.py --tree base=$ROOT/.ab/base_tree --tree zero=$ROOT --only "^bwd" --rounds 3 --repeats 20 > $OUT/ab_bwd.log 2>&1
tail -19 $OUT/ab_bwd.log
echo "total $(( $(date +%s) - T0 )) s"
