#!/bin/bash
# session 41 call 1: the GPU grid on tag s40-decode-d80-hopper-pad128-unverified brought back on top of main
# (decode at head dim 80, Hopper pads 80/96 to 128, padded head dims 16/80, the mended reduce-overhead test),
# then the padding-width bench (pad96 vs pad128 vs cuDNN) and Phi-2's decode at head dim 80
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
bash scripts/gpu_grid.sh $OUT 230
T0=$(date +%s)
timeout 220 python3 scripts/bench_padded_head_dim.py --seconds 0.3 --rounds 3 > $OUT/bench_padded_head_dim.log 2>&1
echo "bench rc=$? $(( $(date +%s) - T0 )) s"
tail -20 $OUT/bench_padded_head_dim.log
timeout 90 python3 scripts/bench_decode.py --only head-dim-80 --rounds 3 > $OUT/bench_decode_d80.log 2>&1
echo "decode bench rc=$?"; tail -9 $OUT/bench_decode_d80.log
