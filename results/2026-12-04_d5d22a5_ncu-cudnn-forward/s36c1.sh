#!/bin/bash
# session 36 call 1: ncu on cuDNN's and our forward kernels at 2k (per-instruction SASS counts and stall samples)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .ab/s36c1.sh .ab/ncu_probe.py $OUT/
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
which ncu; ncu --version | tail -1
T0=$(date +%s)
prof() {  # name impl d batch seqlen mask
  local name=$1; shift
  local regex='regex:hfp_attention_forward'; [ "$1" = cudnn ] && regex='regex:fprop'
  timeout 150 ncu --clock-control none --kernel-name "$regex" --launch-skip 2 --launch-count 1 --set full \
    --import-source no -o /tmp/$name -f python3 .ab/ncu_probe.py "$@" > /tmp/$name.run.log 2>&1
  tail -3 /tmp/$name.run.log
  ncu -i /tmp/$name.ncu-rep --page details > /tmp/$name.details.txt 2>&1
  ncu -i /tmp/$name.ncu-rep --page source --print-source sass --csv > /tmp/$name.sass.csv 2>&1
  echo "$name: $(wc -l < /tmp/$name.sass.csv) sass lines, $(( $(date +%s) - T0 )) s"
}
prof cudnn_d128_2k_full cudnn 128 8 2048 full
prof ours_d128_2k_full ours 128 8 2048 full
prof cudnn_d128_2k_causal cudnn 128 8 2048 causal
prof ours_d128_2k_causal ours 128 8 2048 causal
prof cudnn_d64_2k_causal cudnn 64 8 2048 causal
prof ours_d64_2k_causal ours 64 8 2048 causal
cd /tmp && tar czf $OUT/ncu_sass.tar.gz *.sass.csv && tar czf $OUT/ncu_details.tar.gz *.details.txt *.run.log
ls -la $OUT
grep -h -E "^  [a-z_]+.*\(|Duration|Executed Ipc Active|Issue Slots Busy|Warp Cycles Per Issued|Registers Per|Dynamic Shared" /tmp/*.details.txt | head -80
echo "total $(( $(date +%s) - T0 )) s"
