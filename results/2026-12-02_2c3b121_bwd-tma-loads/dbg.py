"""One varlen backward call (GQA, lengths 1 113 0 239 1023 64) on the shipped build of head dims (d, d_v)."""
import sys

import torch

from hf_flashpatch.kernels import backward as bwd
from hf_flashpatch.kernels.build import compile_cubin

d, dv = int(sys.argv[1]), int(sys.argv[2])
lens = [int(x) for x in sys.argv[3].split(",")] if len(sys.argv) > 3 else [1, 113, 0, 239, 1023, 64]
cu = torch.tensor([0] + lens, device="cuda").cumsum(0).int()
t = int(cu[-1])
q = torch.randn(t, 4, d, device="cuda", dtype=torch.bfloat16)
k = torch.randn(t, 2, d, device="cuda", dtype=torch.bfloat16)
v = torch.randn(t, 2, dv, device="cuda", dtype=torch.bfloat16)
out, dout = torch.randn(t, 4, dv, device="cuda", dtype=torch.bfloat16), torch.randn(t, 4, dv, device="cuda", dtype=torch.bfloat16)
lse = torch.randn(4, t, device="cuda")
cfg = bwd.BackwardConfig.choose(d, torch.bfloat16, False, "sm_90a", head_dim_v=None if d == dv else dv)
open(f"{sys.argv[4] if len(sys.argv) > 4 else '/tmp'}/bwd_d{d}_{dv}.cubin", "wb").write(compile_cubin(cfg.build())[0])
g = bwd._kernel_backward(cfg, dout, q, k, v, out, lse, None, cu, cu, max(lens), max(lens), 0.1, -1, 0, 0.0, False)
torch.cuda.synchronize()
print(f"d{d}/{dv} lens {lens}: ok, finite {[bool(x.isfinite().all()) for x in g]}")
