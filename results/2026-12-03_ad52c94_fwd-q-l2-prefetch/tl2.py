"""Forward work timeline per math warp (scratch instrumentation in .ab/tl_tree, not shipped): clock64 of each math
warp's lane 0 at a work's start (0), its first K tile landed (6; k0_wait = 6 - 3), past the warpgroup's first barrier (1), its Q copy landed (2), past the second
barrier (3), after its output stores (4); Q-by-TMA builds: 1 = 2 = 3 = Q landed."""
import sys
import numpy as np
import torch
from hf_flashpatch.kernels import forward, build
import pycuda.driver as drv

ENTRY = "hfp_attention_forward_sm90_ws"


def read_global(d, name):
    kern = [kk for (b, e, i), kk in build._kernels.items() if e == ENTRY and dict(b.defines).get("HEAD_DIM") == str(d)]
    out = []
    with build._InContext(0):
        for kk in kern:
            ptr, size = kk.module.get_global(name)
            buf = np.zeros(size // 8, dtype=np.uint64)
            drv.memcpy_dtoh(buf, ptr)
            drv.memset_d8(ptr, 0, size)
            out.append(buf)
    return out


def case(d, dv, causal, batch, seqlen, heads):
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda dd: torch.randn(batch, seqlen, heads, dd, device="cuda", dtype=torch.bfloat16, generator=g)
    q, k, v = r(d), r(d), r(dv)
    run = lambda: forward.attention_forward(q, k, v, causal=causal, softmax_scale=None, window_left=-1,
                                            window_right=0 if causal else -1, softcap=None)
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    read_global(d, "hfp_works")
    run()
    torch.cuda.synchronize()
    bufs = [b for b in read_global(d, "hfp_works") if b.any()]
    w = bufs[0].reshape(1024, 48, 8, 7).astype(np.int64)
    rows = {k: [] for k in ("barrier1", "copy", "barrier2", "k0_wait", "body", "gap", "skew_start", "skew_end")}
    tiles = []
    for b in range(1024):
        n = int(np.sum(w[b, :, 0, 0] != 0))
        for i in range(n):
            for wg in range(2):
                ws = w[b, i, 4 * wg:4 * wg + 4]
                rows["skew_start"].append(ws[:, 0].max() - ws[:, 0].min())
                rows["skew_end"].append(ws[:, 4].max() - ws[:, 4].min())
                for x in ws:
                    rows["barrier1"].append(x[1] - x[0]); rows["copy"].append(x[2] - x[1])
                    rows["barrier2"].append(x[3] - x[2]); rows["body"].append(x[4] - x[3]); tiles.append(x[5])
                    rows["k0_wait"].append(x[6] - x[3])
                    if i + 1 < n:
                        pass
                if i + 1 < n:
                    nx = w[b, i + 1, 4 * wg:4 * wg + 4]
                    rows["gap"] += list(nx[:, 0] - ws[:, 4])
    name = f"fwd d{d}/{dv} {batch}x{seqlen // 1024}k {'causal' if causal else 'full'}"
    med = {k: int(np.median(v)) if v else 0 for k, v in rows.items()}
    p90 = {k: int(np.percentile(v, 90)) if v else 0 for k, v in rows.items()}
    print(f"== {name}: median tiles {int(np.median(tiles))}; clocks median (p90): " +
          ", ".join(f"{k} {med[k]} ({p90[k]})" for k in rows))


for args in [(128, 128, False, 8, 2048, 16), (128, 128, False, 4, 4096, 16), (128, 128, False, 1, 16384, 16),
             (128, 128, True, 8, 2048, 16), (192, 128, True, 4, 4096, 16)]:
    try:
        case(*args)
    except Exception:
        import traceback; traceback.print_exc()
