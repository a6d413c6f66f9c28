#!/bin/bash
# session 23 call 2: dK issued after dQ (dQ's stores under dK) against 8aeac92 (.ab/base_tree); GPU tests on the
# new tree, kernel A/B in CUDA graphs, the new step's timeline (.ab/tl2), cuDNN sweep
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/cA timeout 240 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_backward.py -k "not varlen and not window" > $OUT/tests_backward_core.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cD timeout 240 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_backward.py -k "varlen or window" > $OUT/tests_backward_varlen_window.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cB timeout 240 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_value_head_dim_gpu.py tests/gpu/test_training.py tests/gpu/test_sinks_gpu.py > $OUT/tests_vhd_training_sinks.log 2>&1 &
(cd $ROOT/.ab/tl2 && HF_FLASHPATCH_CACHE=/tmp/c_tl PYTHONPATH=/tmp/site:$ROOT/.ab/tl2 timeout 200 python timeline.py > $OUT/timeline.log 2>&1) &
wait
echo "tests took $(( $(date +%s) - T0 )) s"
for f in $OUT/tests_*.log; do echo "$(basename $f): $(tail -1 $f)"; done
grep -hE "^FAILED|^ERROR" $OUT/tests_*.log | head -8
grep -v Warn $OUT/timeline.log | head -24
timeout 240 python scripts/ab_kernels.py --tree base=$ROOT/.ab/base_tree --tree dqfirst=$ROOT --only "^bwd" --rounds 3 --repeats 20 > $OUT/ab_bwd.log 2>&1
tail -12 $OUT/ab_bwd.log
HF_FLASHPATCH_CACHE=/tmp/bench timeout 150 python scripts/bench_backward.py --quick --only kernels --head-dims 128,64 > $OUT/bench_bwd_kernels.log 2>&1
grep -E "^(ours|sdpa_cudnn|ours/sdpa_cudnn) " $OUT/bench_bwd_kernels.log | head -24
echo "total $(( $(date +%s) - T0 )) s"
