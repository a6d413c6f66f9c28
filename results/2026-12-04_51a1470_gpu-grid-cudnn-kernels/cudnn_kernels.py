"""Probe: which kernel cuDNN runs for torch SDPA at the issue-14 shapes, with its launch geometry (torch profiler)."""
import json, os, tempfile
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

out_dir = os.environ.get("OUT", "/tmp")
rows = []
for d, batch, seqlen, causal in [(128, 8, 2048, False), (128, 8, 2048, True), (128, 1, 16384, False), (64, 8, 2048, True),
                                 (64, 8, 2048, False)]:
    heads = 2048 // d
    q, k, v = (torch.randn(batch, heads, seqlen, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        for _ in range(3):
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            torch.cuda.synchronize()
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    events = [e for e in json.load(open(path))["traceEvents"] if e.get("cat") == "kernel"]
    for e in events:
        a = e.get("args", {})
        rows.append(dict(shape=f"d{d} {batch}x{seqlen} {'causal' if causal else 'full'}", name=e["name"][:140],
                         dur_us=e.get("dur"), grid=a.get("grid"), block=a.get("block"),
                         regs=a.get("registers per thread"), smem=a.get("shared memory"),
                         blocks_per_sm=a.get("blocks per SM"), occupancy=a.get("est. achieved occupancy %")))
for r in rows:
    print(json.dumps(r))
json.dump(rows, open(os.path.join(out_dir, "cudnn_kernels.json"), "w"), indent=1)
