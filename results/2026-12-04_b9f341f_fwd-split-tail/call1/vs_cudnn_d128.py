"""d128 forward, 16k tokens (batch = 16384 // seqlen), 16 heads, non-causal: ours against cuDNN in turns (bench_forward's
rows), five rounds; the schedule each shape launched with."""
import sys
sys.path.insert(0, "scripts")
import torch
import bench_forward as bf
from bench_timing import median_ms, speed_ratio, time_rounds
from hf_flashpatch.kernels import heuristics

for seqlen in (2048, 4096, 16384):
    batch, heads, q, k, v = bf._inputs(seqlen, 128)
    walk = heuristics.hopper_forward_schedule(seqlen, seqlen, 1, 128, 176, -1, -1, heads * batch, 132, False,
                                              seqlen * 512, True)
    fns = {"ours": bf._ours(q, k, v, False), "cudnn": bf._sdpa(q, k, v, False, "cudnn")}
    t = time_rounds(fns)
    r = speed_ratio(t["ours"], t["cudnn"])
    print(f"fwd d128 {batch}x{seqlen} full: ours {bf._tflops(batch, heads, seqlen, 128, False, median_ms(t['ours'])):.1f} "
          f"cudnn {bf._tflops(batch, heads, seqlen, 128, False, median_ms(t['cudnn'])):.1f} TFLOP/s, "
          f"ours/cudnn {r[0]:.3f} (rounds {r[1]:.3f}-{r[2]:.3f}); {walk}")
