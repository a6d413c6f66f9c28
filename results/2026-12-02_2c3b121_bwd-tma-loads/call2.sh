#!/bin/bash
# call 2 (session 22): where the varlen backward's illegal instruction comes from (compute-sanitizer)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_FLASHPATCH_CACHE=/tmp/cdbg
mkdir -p $OUT
CS=$(ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || which compute-sanitizer)
echo "sanitizer: $CS"
for lens in "64,64" "1,113" "1,113,0,239,1023,64"; do
  timeout 60 python .ab/dbg.py 64 64 $lens $OUT 2>&1 | tail -2
done
timeout 60 python .ab/dbg.py 128 128 "1,113" $OUT 2>&1 | tail -2
timeout 120 $CS --tool memcheck --print-limit 5 python .ab/dbg.py 64 64 "1,113" $OUT > $OUT/memcheck_d64.log 2>&1
grep -E "Invalid|Illegal|at 0x|ERROR SUMMARY|by thread|Address" $OUT/memcheck_d64.log | head -20
timeout 120 $CS --tool synccheck --print-limit 5 python .ab/dbg.py 64 64 "1,113" $OUT > $OUT/synccheck_d64.log 2>&1
grep -E "Barrier|Divergent|at 0x|ERROR SUMMARY" $OUT/synccheck_d64.log | head -10
/usr/local/cuda/bin/cuobjdump -sass $OUT/bwd_d64_64.cubin > $OUT/bwd_d64.sass 2>&1; wc -l $OUT/bwd_d64.sass
