#!/bin/bash
# session 36 call 4: at 93bea03: the 192/128 output boxes A/B (.ab/y against .ab/x = bf05416, A/A copy .ab/x2), the
# sustained table, then the whole GPU grid
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT; cp .ab/s36c4.sh $OUT/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T0=$(date +%s)
timeout 120 python scripts/ab_kernels.py --tree main=$ROOT/.ab/x --tree aa=$ROOT/.ab/x2 --tree mla=$ROOT/.ab/y --only "^fwd d192" --rounds 3 --repeats 20 > $OUT/ab_mla.log 2>&1
grep -A4 "after round" $OUT/ab_mla.log | grep -E "graph" | tail -3
echo "ab $(( $(date +%s) - T0 )) s"
T0=$(date +%s)
timeout 200 python scripts/bench_sustained.py --seconds 0.6 --rounds 5 > $OUT/bench_sustained.log 2>&1
grep -E "forward|backward" $OUT/bench_sustained.log
echo "sustained $(( $(date +%s) - T0 )) s"
T0=$(date +%s)
run() { local name=$1; shift; HF_FLASHPATCH_CACHE=/tmp/c_$name timeout 230 python -m pytest -q -m gpu -p no:cacheprovider "$@" > $OUT/tests_$name.log 2>&1; echo "rc=$?" >> $OUT/tests_$name.log; }
run forward tests/gpu/test_forward.py &
run backward_core tests/gpu/test_backward.py -k "not varlen" &
run backward_varlen tests/gpu/test_backward.py -k varlen &
run training_vdim_sinks tests/gpu/test_training.py tests/gpu/test_value_head_dim_gpu.py tests/gpu/test_sinks_gpu.py &
run decode_backend tests/gpu/test_decode.py tests/gpu/test_bad_tables.py tests/gpu/test_paged_generate.py tests/gpu/test_build_gpu.py tests/gpu/test_compile_gpu.py tests/gpu/test_backend_gpu.py tests/gpu/test_architectures_gpu.py &
wait
for f in $OUT/tests_*.log; do echo "$(basename $f): $(grep -E 'passed|failed|error' $f | tail -1) $(tail -1 $f)"; done
grep -hE "^FAILED|^ERROR" $OUT/tests_*.log | head -12
cd $OUT && tar czf tests_logs.tar.gz tests_*.log && rm tests_*.log
echo "grid $(( $(date +%s) - T0 )) s"
