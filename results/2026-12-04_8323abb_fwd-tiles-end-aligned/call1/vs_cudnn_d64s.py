"""d64 forward 8 x 2048, 32 heads, causal: ours against cuDNN, sustained timing (bench_sustained's), five rounds of 0.5 s."""
import sys
sys.path.insert(0, "scripts")
import bench_forward as bf
from bench_timing import median_ms, speed_ratio, time_rounds, time_sustained_ms

batch, heads, q, k, v = bf._inputs(2048, 64)
fns = {"ours": bf._ours(q, k, v, True), "cudnn": bf._sdpa(q, k, v, True, "cudnn")}
t = time_rounds(fns, 5, timer=lambda fn: time_sustained_ms(fn, 0.5))
r = speed_ratio(t["ours"], t["cudnn"])
print(f"fwd d64 8x2048 causal sustained: ours {bf._tflops(batch, heads, 2048, 64, True, median_ms(t['ours'])):.1f} "
      f"cudnn {bf._tflops(batch, heads, 2048, 64, True, median_ms(t['cudnn'])):.1f} TFLOP/s, ours/cudnn {r[0]:.3f} "
      f"(rounds {r[1]:.3f}-{r[2]:.3f})")
