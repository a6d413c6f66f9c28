#!/usr/bin/env bash
# The whole GPU test grid in about three minutes on one H200: six pytest processes side by side, each with a
# kernel cache of its own (they compile different builds), logs packed into one file (the device returns at most
# eight files). Usage, from the project root on the GPU machine, with the missing wheels installed (gpu_check.sh):
#   bash scripts/gpu_grid.sh OUT_DIR [seconds per group, default 230]
# Prints one line per group and the failures; exits 1 if any group failed or ran out of time.
set -uo pipefail
out=${1:?usage: gpu_grid.sh OUT_DIR [seconds]}
limit=${2:-230}
mkdir -p "$out"
work=$(mktemp -d)
group() {  # name, pytest arguments
  local name=$1
  shift
  HF_FLASHPATCH_CACHE=$work/cache_$name timeout "$limit" python3 -m pytest -q -m gpu -p no:cacheprovider "$@" \
    > "$work/tests_$name.log" 2>&1
  echo "rc=$?" >> "$work/tests_$name.log"
}
t0=$(date +%s)
group forward tests/gpu/test_forward.py tests/gpu/test_forward_walks.py &
group forward_chained tests/gpu/test_forward_chained_walk.py tests/gpu/test_forward_split_tail.py &
group backward_core tests/gpu/test_backward.py -k "not varlen" &
group backward_varlen_vdim tests/gpu/test_backward.py tests/gpu/test_value_head_dim_gpu.py -k "varlen or value_head_dim" &
group training_sinks tests/gpu/test_training.py tests/gpu/test_sinks_gpu.py tests/gpu/test_misaligned_inputs.py &
group decode_backend tests/gpu/test_decode.py tests/gpu/test_bad_tables.py tests/gpu/test_paged_generate.py \
  tests/gpu/test_build_gpu.py tests/gpu/test_compile_gpu.py tests/gpu/test_backend_gpu.py \
  tests/gpu/test_architectures_gpu.py tests/gpu/test_bidirectional_gpu.py &
wait
failed=0
for log in "$work"/tests_*.log; do
  name=$(basename "$log" .log)
  echo "${name#tests_}: $(grep -E 'passed|failed|error|skipped' "$log" | tail -1) $(tail -1 "$log")"
  tail -1 "$log" | grep -qE "rc=(0|5)$" || failed=1  # 5: nothing collected (no CUDA: every module skips itself)
done
grep -hE "^(FAILED|ERROR)" "$work"/tests_*.log | head -20
tar czf "$out/gpu_grid_logs.tar.gz" -C "$work" $(cd "$work" && ls tests_*.log)
echo "grid $(( $(date +%s) - t0 )) s"
rm -rf "$work"
exit $failed
