#!/bin/bash
# Call 1: the SASS of the unmasked builds (main against the dealt walk's tree, in the background), the whole GPU grid,
# then walk_probe.py (busy warpgroups; dealt against plain, one build). Carry .whl and ab (ab/main: main's cuda and
# hf_flashpatch; ab/new: this tree's).
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export PATH=$PATH:/usr/local/cuda/bin:$(python3 -c "import triton,os;print(os.path.dirname(triton.__file__))" 2>/dev/null)/backends/nvidia/bin
mkdir -p $OUT
D=results/2026-12-07_d64-dealt-walk
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
git log -1 --format=%h 2>/dev/null
(python3 $D/sass_compare.py ab/main ab/new > $OUT/sass.log 2>&1) &
bash scripts/gpu_grid.sh $OUT 200 > $OUT/grid.log 2>&1; tail -12 $OUT/grid.log
wait
cat $OUT/sass.log
HF_FLASHPATCH_CACHE=/tmp/cW timeout 200 python3 $D/walk_probe.py --rounds 5 > $OUT/walk_probe.log 2>&1
cat $OUT/walk_probe.log
echo "total $(( $(date +%s) - START )) s"
