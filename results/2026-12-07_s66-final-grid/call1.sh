#!/bin/bash
# Call 1 (any card): the whole GPU test grid on the committed code, the shipped-cubin manifest written with this
# machine's cuobjdump, and, on an H200, issue 14's forward rows sustained. Carry .whl.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export PATH=$PATH:/usr/local/cuda/bin:$(python3 -c "import triton,os;print(os.path.dirname(triton.__file__))" 2>/dev/null)/backends/nvidia/bin
mkdir -p $OUT
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "$GPU"
(python3 scripts/check_shipped_cubins.py --write $OUT/shipped_cubins.json --jobs 8 > $OUT/manifest.log 2>&1;
 echo "manifest rc $?" >> $OUT/manifest.log) &
bash scripts/gpu_grid.sh $OUT 280 2>&1 | tee $OUT/grid.log
wait
tail -2 $OUT/manifest.log
if [[ "$GPU" == *H200* ]]; then
  HF_FLASHPATCH_CACHE=/tmp/cS timeout 200 python3 scripts/bench_sustained.py --seconds 0.6 --rounds 5 \
    --seqlens 2048 4096 8192 16384 --head-dims 128 64 --parts forward 2>&1 | tee $OUT/sustained.log | tail -17
fi
echo "total $(( $(date +%s) - START )) s"
