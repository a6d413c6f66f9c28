#!/bin/bash
# call 6 (session 21): dQ through shared memory and the TMA reduce-add (d128), working tree against main (62765a8)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT /tmp/main
git archive 62765a8 cuda hf_flashpatch scripts | tar -x -C /tmp/main
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/cA timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_backward.py > $OUT/tests_backward.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cB timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_value_head_dim_gpu.py tests/gpu/test_training.py tests/gpu/test_sinks_gpu.py > $OUT/tests_vhd_training_sinks.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cC timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_compile_gpu.py tests/gpu/test_build_gpu.py > $OUT/tests_compile_build.log 2>&1 &
wait
echo "tests took $(( $(date +%s) - T0 )) s"
for f in $OUT/tests_*.log; do echo "$f: $(tail -1 $f)"; done
grep -E "FAILED|Error" $OUT/tests_*.log | head -5
timeout 200 python scripts/ab_kernels.py --tree main=/tmp/main --tree tma=$ROOT --only "^bwd d(128|64) " --rounds 2 --repeats 20 > $OUT/ab_bwd.log 2>&1
tail -8 $OUT/ab_bwd.log
HF_FLASHPATCH_CACHE=/tmp/bench timeout 120 python scripts/bench_backward.py --quick --only kernels --head-dims 128 > $OUT/bench_bwd_d128.log 2>&1
grep -E "^(ours|sdpa_cudnn|ours/sdpa_cudnn) " $OUT/bench_bwd_d128.log
echo "total $(( $(date +%s) - T0 )) s"
