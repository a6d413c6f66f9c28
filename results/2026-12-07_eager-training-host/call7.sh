#!/bin/bash
# The trimmed host path (device arch asked once per device, a forward config and its build made once, a backward
# build made once, TMA maps looked up before their geometry, one fp32 workspace allocation in the backward, a leaner
# aligned() and pack()) and the unaligned-input fix: the GPU grid with tests/gpu/test_misaligned_inputs.py, then the
# host time of the training call with main's package (ab/main, HEAD's hf_flashpatch) and the working tree's, in turns,
# three rounds each (the host's time moves 30 % between runs). Carry .whl, ab. About 330 s.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
PYTHONPATH=/tmp/site:$PWD bash scripts/gpu_grid.sh $OUT 200 > $OUT/grid.log 2>&1; echo "grid rc $?"
cat $OUT/grid.log
export HF_FLASHPATCH_CACHE=/tmp/cA
for round in 1 2 3; do
  for tree in ab/main .; do
    name=$([ "$tree" = . ] && echo new || echo main)
    PYTHONPATH=/tmp/site:$PWD/$tree timeout 60 python3 scripts/profile_host.py --training --calls 300 --top 3 \
      > $OUT/host_${name}_$round.log 2>&1
    echo "== $name round $round"; sed -n '/^form/,/^timeline/p' $OUT/host_${name}_$round.log | grep -v timeline
  done
done
echo "total $(( $(date +%s) - START )) s"
