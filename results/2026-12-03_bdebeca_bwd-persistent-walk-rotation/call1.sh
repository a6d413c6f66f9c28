#!/bin/bash
# session 24 call 1: the persistent dK/dV walk (working tree) against bdebeca (.ab/base_tree); GPU tests on the
# working tree; cuDNN sweep; fine-tune
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT
cp .ab/call1.sh $OUT/
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/cA timeout 220 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_backward.py -k "not varlen and not window" > $OUT/tests_backward_core.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cD timeout 220 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_backward.py -k "varlen or window" > $OUT/tests_backward_varlen_window.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cB timeout 220 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_value_head_dim_gpu.py tests/gpu/test_training.py tests/gpu/test_sinks_gpu.py > $OUT/tests_vhd_training_sinks.log 2>&1 &
wait
echo "tests took $(( $(date +%s) - T0 )) s"
for f in $OUT/tests_*.log; do echo "$(basename $f): $(tail -1 $f)"; done
grep -hE "^FAILED|^ERROR" $OUT/tests_*.log | head -8
timeout 200 python scripts/ab_kernels.py --tree base=$ROOT/.ab/base_tree --tree walk=$ROOT --only "^bwd" --rounds 3 --repeats 20 > $OUT/ab_bwd.log 2>&1
tail -19 $OUT/ab_bwd.log
HF_FLASHPATCH_CACHE=/tmp/bench timeout 100 python scripts/bench_backward.py --quick --only kernels --head-dims 128,64 > $OUT/bench_bwd_kernels.log 2>&1
grep -E "^(ours|sdpa_cudnn|ours/sdpa_cudnn) " $OUT/bench_bwd_kernels.log | head -24
tail -12 $OUT/bench_bwd_kernels.log
for tree in base new; do
  D=$ROOT; [ $tree = base ] && D=$ROOT/.ab/base_tree
  (cd $D && HF_FLASHPATCH_CACHE=/tmp/t_$tree PYTHONPATH=/tmp/site:$D timeout 70 python $D/scripts/bench_backward.py --quick --only training > $OUT/training_$tree.log 2>&1)
  echo "$tree: $(grep -E '^(sdpa|hfpatch) ' $OUT/training_$tree.log | awk '{print $1, $3, $5}' | tr '\n' ' ')"
done
echo "total $(( $(date +%s) - T0 )) s"
