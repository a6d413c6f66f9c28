"""Where a backward's time goes: every CUDA kernel of one call (ours: the op the autograd calls; cuDNN: SDPA's
backward through autograd.grad), from torch.profiler, at the bench's 16k-token shapes."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path.cwd() / "scripts"))
sys.path.insert(0, str(Path.cwd()))
import bench_backward as bb  # noqa: E402

ITERS = 10


def profile(name, fn):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(ITERS):
        fn()
    end.record()
    torch.cuda.synchronize()
    wall = start.elapsed_time(end) / ITERS * 1000
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(ITERS):
            fn()
        torch.cuda.synchronize()
    rows = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            rows[ev.name] = rows.get(ev.name, 0.0) + ev.device_time / ITERS
    total = sum(rows.values())
    print(f"  {name}: {wall:8.1f} us a call (events), kernels {total:8.1f} us")
    for k, us in sorted(rows.items(), key=lambda kv: -kv[1]):
        print(f"    {us:8.1f} us  {k[:110]}")


for seqlen, head_dim in [(2048, 128), (16384, 128), (2048, 64), (16384, 64)]:
    for causal in (False,):
        batch, heads, q, k, v, dout = bb._inputs(seqlen, head_dim)
        print(f"== d{head_dim} {batch}x{seqlen} heads {heads} {'causal' if causal else 'full'}")
        profile("ours", bb._ours(q, k, v, dout, causal, False))
        profile("sdpa_cudnn", bb._sdpa(q, k, v, dout, causal, "cudnn"))
        del q, k, v, dout
        torch.cuda.empty_cache()
