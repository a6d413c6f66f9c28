#!/bin/bash
# Session 57: on an H200, issue 14's sustained table on main (../2026-12-06_issue14-table/call_s56.sh). On an H100
# (main's table there is session 56's, same kernels): Nsight Compute on the d128 forward at 8x2k, ours (the chained
# walk unmasked, the masked walk causal) and cuDNN's, as session 36 ran it before the chain
# (../2026-12-04_d5d22a5_ncu-cudnn-forward): per-instruction counts and stall samples, the section pages. Carry .whl.
# Usage: bash call1.sh [seconds for the H200 table, default 540]
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
if [[ "$GPU" == *H200* ]]; then
  bash results/2026-12-06_issue14-table/call_s56.sh ${1:-540}
  exit
fi
DIR=results/2026-12-04_d5d22a5_ncu-cudnn-forward  # its probe and summaries
which ncu; ncu --version | tail -1
prof() {  # name impl d batch seqlen mask
  local name=$1; shift
  local regex='regex:hfp_attention_forward'; [ "$1" = cudnn ] && regex='regex:fprop'
  timeout 150 ncu --clock-control none --kernel-name "$regex" --launch-skip 2 --launch-count 1 --set full \
    --import-source no -o /tmp/$name -f python3 $DIR/ncu_probe.py "$@" > /tmp/$name.run.log 2>&1
  tail -2 /tmp/$name.run.log
  ncu -i /tmp/$name.ncu-rep --page details > /tmp/$name.details.txt 2>&1
  ncu -i /tmp/$name.ncu-rep --page source --print-source sass --csv > /tmp/$name.sass.csv 2>&1
  echo "$name: $(wc -l < /tmp/$name.sass.csv) sass lines, $(( $(date +%s) - START )) s"
}
prof ours_d128_2k_full ours 128 8 2048 full
prof cudnn_d128_2k_full cudnn 128 8 2048 full
prof ours_d128_2k_causal ours 128 8 2048 causal
prof cudnn_d128_2k_causal cudnn 128 8 2048 causal
(cd /tmp && tar czf $OUT/ncu_sass.tar.gz *.sass.csv && tar czf $OUT/ncu_details.tar.gz *.details.txt *.run.log)
python3 $DIR/work_classes.py /tmp; python3 $DIR/sass_mix.py /tmp
grep -h -E "^  [a-z_]+.*\(|Duration|Elapsed Cycles|Issue Slots Busy|Warp Cycles Per Issued" /tmp/*.details.txt | head -40
echo "total $(( $(date +%s) - START )) s"
