#!/bin/bash
# session 28 call 2: masked d128's build by the walk (one CTA per tile: 24 / 240, math warps copy Q); interleaved benches
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT; cp .ab/s28c2.sh $OUT/
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/cA timeout 230 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "not varlen and not query_rows and not persistent" > $OUT/tests_forward_core.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cB timeout 230 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "varlen or query_rows or persistent" > $OUT/tests_forward_varlen_q_walk.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cC timeout 230 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_training.py tests/gpu/test_sinks_gpu.py tests/gpu/test_backend_gpu.py tests/gpu/test_compile_gpu.py > $OUT/tests_training_sinks_backend_compile.log 2>&1 &
wait
for f in $OUT/tests_*.log; do echo "$(basename $f): $(tail -1 $f)"; done
grep -hE "^FAILED|^ERROR" $OUT/tests_*.log | head -8
echo "tests $(( $(date +%s) - T0 )) s"
timeout 110 python scripts/ab_kernels.py --tree main=$ROOT/.ab/main_tree --tree new=$ROOT --only "^fwd d128 .*causal" --rounds 3 --repeats 20 > $OUT/ab_fwd.log 2>&1
tail -4 $OUT/ab_fwd.log | grep graph
echo "ab $(( $(date +%s) - T0 )) s"
timeout 150 python scripts/bench_forward.py --quick > $OUT/bench_forward.log 2>&1
grep -E "^ours/sdpa_cudnn " $OUT/bench_forward.log | grep -v "192"
echo "bench fwd $(( $(date +%s) - T0 )) s"
timeout 120 python scripts/bench_backward.py --quick --only kernels --head-dims 128,64 > $OUT/bench_backward.log 2>&1
grep -E "^ours/sdpa_cudnn " $OUT/bench_backward.log
echo "total $(( $(date +%s) - T0 )) s"
