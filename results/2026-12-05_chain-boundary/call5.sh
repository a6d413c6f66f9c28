#!/bin/bash
# Session 49, call 1 (run before call4.sh): session 48's GPU checks, in parallel on one GPU (tests, no timings):
# 1. the whole GPU grid on main (its decode_backend group holds the new past_the_last test of test_bad_tables.py);
# 2. the chain's GPU tests on tag s48-final-pv-issue-pv (the chained walk's last P V through issue_pv; the loop's SASS
#    unchanged but for branch targets): if they pass, land it and rewrite scripts/shipped_cubins.json;
# 3. continuous batching on the GPU under transformers 5.21.1 (the 5.19-5.23 hand-over, fixed on the CPU in session
#    48; the device's own transformers is 5.17).
# Before, on the development machine (carry .whl, ab and .tfnew):
#   mkdir -p ab/ab_final_pv && git archive s48-final-pv-issue-pv cuda hf_flashpatch scripts | tar x -C ab/ab_final_pv
#   python3 -m pip download --no-deps transformers==5.21.1 -d .tfnew   (.tfnew also holds hub.tgz, hub_deps.tgz)
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
git log --oneline -1 2>/dev/null
bash scripts/gpu_grid.sh $OUT 300 > $OUT/grid.log 2>&1 &
# From inside the tree: `python -m` puts the working directory first on sys.path, so its hf_flashpatch is the one run.
(cd ab/ab_final_pv && PYTHONPATH=/tmp/site timeout 240 python3 -c "import hf_flashpatch; print(hf_flashpatch.__file__)" \
  && PYTHONPATH=/tmp/site HF_FLASHPATCH_CACHE=/tmp/cache_final_pv timeout 240 python3 -m pytest -q -p no:cacheprovider \
  ../../tests/gpu/test_forward_chained_walk.py) > $OUT/final_pv_tests.log 2>&1 &
mkdir -p /tmp/tf521 && tar xzf .tfnew/hub.tgz -C /tmp/tf521 && tar xzf .tfnew/hub_deps.tgz -C /tmp/tf521
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/tf521 .tfnew/transformers-5.21.1-*.whl \
  .tfnew/tokenizers-*.whl .tfnew/safetensors-*.whl 2>/dev/null
(export PYTHONPATH=/tmp/tf521:/tmp/site:$PWD HF_FLASHPATCH_CACHE=/tmp/cache_521
 python3 -c "import transformers; print('transformers', transformers.__version__)"
 timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_paged_generate.py \
   tests/gpu/test_backend_gpu.py tests/gpu/test_compile_gpu.py tests/gpu/test_architectures_gpu.py) \
  > $OUT/transformers_5_21.log 2>&1 &
wait
tail -12 $OUT/grid.log
echo "== final_pv: $(head -1 $OUT/final_pv_tests.log) $(tail -1 $OUT/final_pv_tests.log)"
grep -E "^(FAILED|ERROR)" $OUT/final_pv_tests.log | head
echo "== $(head -1 $OUT/transformers_5_21.log): $(tail -1 $OUT/transformers_5_21.log)"
grep -E "^(FAILED|ERROR)" $OUT/transformers_5_21.log | head
# Where time is left (the device's starts were scarce): call 4's A/B of the shadow probes alone, after the tests.
LEFT=$(( ${DEADLINE:-480} - ($(date +%s) - START) ))  # DEADLINE: the seconds this call may run
if [ $LEFT -gt 150 ]; then
  timeout $(( LEFT - 5 )) python3 scripts/ab_kernels.py --tree main=ab/ab_main --tree shadow=ab/ab_shadow \
    --tree none=ab/ab_none --tree finish=ab/ab_finish --tree copy=ab/ab_copy --tree switch=ab/ab_switch --rounds 3 \
    --only "^fwd d128 (8x2k|4x4k) full$" > $OUT/ab_probes.log 2>&1
  tail -8 $OUT/ab_probes.log
fi
echo "total $(( $(date +%s) - START )) s"
