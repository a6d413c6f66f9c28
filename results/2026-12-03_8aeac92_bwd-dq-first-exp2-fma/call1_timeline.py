"""Per-phase clock64 timeline of one CTA of the wgmma backward (scratch instrumentation, not shipped)."""
import sys
import numpy as np
import torch
sys.path.insert(0, ".")
from hf_flashpatch.kernels import backward, forward, build

NP = 14
PH = ["top", "stage ok", "S/dP issued", "S done", "dV issued", "dP done", "dS+dK issued", "B", "loads issued",
      "dV/dK done", "dQ issued", "dQ done", "dQ stored+bar", "reduce issued"]
def run(d, causal, seqlen=4096, heads=16, batch=4, kv_heads=None):
    kv_heads = kv_heads or heads
    g = torch.Generator(device="cuda").manual_seed(0)
    q, do = (torch.randn(batch, seqlen, heads, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(batch, seqlen, kv_heads, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    out, lse = forward.attention_forward(q, k, v, causal=causal, softmax_scale=None, window_left=-1,
                                         window_right=0 if causal else -1, softcap=None)
    for _ in range(3):
        backward.attention_backward(do, q, k, v, out, lse, causal=causal)
    torch.cuda.synchronize()
    kern = [kk for (b, e, i), kk in build._kernels.items() if e == "bwd_dkdv_dq_atomic" and dict(b.defines)["HEAD_DIM"] == str(d)][0]
    import pycuda.driver as drv
    with build._InContext(0):
        ptr, size = kern.module.get_global("hfp_timeline")
        buf = np.zeros(size // 8, dtype=np.uint64)
        drv.memcpy_dtoh(buf, ptr)
        drv.memset_d8(ptr, 0, size)
    t = buf.reshape(2, 64, NP).astype(np.int64)
    print(f"\n== d{d} {'causal' if causal else 'full'} {batch}x{seqlen} heads {heads}/{kv_heads}: block (0,0,0), clocks relative to the step's top")
    steps = [s for s in range(64) if t[0, s, 0] and t[1, s, 0] and t[0, s, NP - 1]]
    use = steps[2:-1] if len(steps) > 4 else steps
    print(f"steps recorded {len(steps)}, used {len(use)}")
    base = t[:, :, :1]
    rel = t - base
    print(f"{'phase':14s} {'wg0 med':>8s} {'wg1 med':>8s}")
    for p in range(NP):
        print(f"{PH[p]:14s} {int(np.median(rel[0, use, p])):8d} {int(np.median(rel[1, use, p])):8d}")
    per_step = np.diff(t[0, use, 0])
    print(f"step period (wg0 top to next top) median {int(np.median(per_step))}, wg1-wg0 top offset median {int(np.median(t[1,use,0]-t[0,use,0]))}")

for d, causal in [(128, False), (64, False), (128, True), (64, True)]:
    run(d, causal)
run(64, True, seqlen=16384, heads=32, batch=1, kv_heads=8)
