"""d64 forward, 8 x 2048, 32 heads, causal and not: ours against cuDNN in turns (bench_forward's rows), five rounds."""
import sys
sys.path.insert(0, "scripts")
import torch
import bench_forward as bf
from bench_timing import median_ms, speed_ratio, time_rounds

for seqlen, causal in ((2048, True), (2048, False)):
    batch, heads, q, k, v = bf._inputs(seqlen, 64)
    fns = {"ours": bf._ours(q, k, v, causal), "cudnn": bf._sdpa(q, k, v, causal, "cudnn")}
    t = time_rounds(fns)
    r = speed_ratio(t["ours"], t["cudnn"])
    print(f"fwd d64 {batch}x{seqlen} causal={causal}: ours {bf._tflops(batch, heads, seqlen, 64, causal, median_ms(t['ours'])):.1f} "
          f"cudnn {bf._tflops(batch, heads, seqlen, 64, causal, median_ms(t['cudnn'])):.1f} TFLOP/s, "
          f"ours/cudnn {r[0]:.3f} (rounds {r[1]:.3f}-{r[2]:.3f})")
