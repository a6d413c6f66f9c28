#!/bin/bash
# After call 4's profile (the 4k step's kernels equal but ours, GPU idle equal under the profiler): is the host side
# of our training call, or the caching allocator, where the unprofiled 4k step loses its kernels' 2.4 ms? Host time
# of one attention forward + backward and of a host-bound model step (scripts/profile_host.py --training), then the
# allocator's device allocations, frees and retries over four 4k steps per backend. Carry .whl. About 120 s.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
export HF_FLASHPATCH_CACHE=/tmp/cA
timeout 120 python3 scripts/profile_host.py --training --calls 200 --top 25 > $OUT/host_training.log 2>&1
grep -v -i warn $OUT/host_training.log | tail -45
timeout $(( 230 - ($(date +%s) - START) )) python3 results/2026-12-07_finetune-4k-profile/alloc_check.py \
  > $OUT/alloc.log 2>&1
grep -v -i warn $OUT/alloc.log
echo "total $(( $(date +%s) - START )) s"
