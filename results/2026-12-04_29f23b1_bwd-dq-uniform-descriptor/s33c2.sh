#!/bin/bash
# session 33 call 2: the d128 backward with uniform dQ descriptors: backward GPU grid, A/B with an A/A pair, vs cuDNN
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT; cp .ab/s33c2.sh $OUT/
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/cA timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_backward.py -k "not varlen" > $OUT/tests_backward_core.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cB timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_backward.py tests/gpu/test_training.py -k "varlen or training or finetune" > $OUT/tests_backward_varlen_training.log 2>&1 &
wait
for f in $OUT/tests_*.log; do echo "$(basename $f): $(tail -1 $f)"; done
grep -hE "^FAILED|^ERROR" $OUT/tests_*.log | head -8
echo "tests $(( $(date +%s) - T0 )) s"
timeout 250 python scripts/ab_kernels.py --tree base=$ROOT/.ab/base_tree --tree base_again=$ROOT/.ab/base_tree --tree uniform_dq=$ROOT --only "^bwd d(128|64 4x4k)" --rounds 3 --repeats 20 > $OUT/ab_bwd.log 2>&1
grep -E "after round|graph" $OUT/ab_bwd.log | tail -10
echo "ab $(( $(date +%s) - T0 )) s"
timeout 100 python scripts/bench_backward.py --quick --only kernels --head-dims 128 > $OUT/bench_backward.log 2>&1
grep -E "^ours/sdpa_cudnn " $OUT/bench_backward.log
echo "total $(( $(date +%s) - T0 )) s"
