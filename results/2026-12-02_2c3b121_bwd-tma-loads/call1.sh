#!/bin/bash
# call 3 (session 22): as call 1, the stats box from the row rounded down to 4 (varlen starts), varlen first
# against main (9a0ca88, carried in .ab/main_tree)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT
T0=$(date +%s)
(for dims in "64 64" "128 128" "192 128"; do timeout 60 python .ab/dbg.py $dims "1,113,0,239,1023,64" /tmp 2>&1 | tail -1; done > $OUT/dbg.log) &
HF_FLASHPATCH_CACHE=/tmp/cA timeout 240 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_backward.py -k "not varlen and not window" > $OUT/tests_backward_core.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cD timeout 240 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_backward.py -k "varlen or window" > $OUT/tests_backward_varlen_window.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cB timeout 240 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_value_head_dim_gpu.py tests/gpu/test_training.py tests/gpu/test_sinks_gpu.py > $OUT/tests_vhd_training_sinks.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cC timeout 240 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_compile_gpu.py tests/gpu/test_build_gpu.py tests/gpu/test_forward.py -k "varlen or compile or build" > $OUT/tests_compile_build_fwdvarlen.log 2>&1 &
wait
cat $OUT/dbg.log
echo "tests took $(( $(date +%s) - T0 )) s"
for f in $OUT/tests_*.log; do echo "$(basename $f): $(tail -1 $f)"; done
grep -hE "^FAILED|^ERROR" $OUT/tests_*.log | head -8
timeout 200 python scripts/ab_kernels.py --tree main=$ROOT/.ab/main_tree --tree tma_loads=$ROOT --only "^bwd" --rounds 2 --repeats 20 > $OUT/ab_bwd.log 2>&1
tail -8 $OUT/ab_bwd.log
HF_FLASHPATCH_CACHE=/tmp/bench timeout 150 python scripts/bench_backward.py --quick --only kernels --head-dims 128,64 > $OUT/bench_bwd_kernels.log 2>&1
grep -E "^(ours|sdpa_cudnn|ours/sdpa_cudnn) " $OUT/bench_bwd_kernels.log | head -12
HF_FLASHPATCH_CACHE=/tmp/bench timeout 90 python scripts/bench_backward.py --quick --only training > $OUT/bench_training.log 2>&1
tail -6 $OUT/bench_training.log
echo "total $(( $(date +%s) - T0 )) s"
