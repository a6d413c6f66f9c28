"""Block / work timelines of the Hopper backward and forward (scratch instrumentation in .ab/tl_tree, not shipped).

Backward: per dK/dV block, thread 0's clock64 at start, K/V landed, before the steps, after step 0, after the steps,
after the dK/dV stores, at exit; globaltimer at start / exit and the SM id. Forward: per CTA and work, each math
warpgroup's first thread's clock64 at the work's start, Q ready, after the output store; its key tiles."""
import sys
import numpy as np
import torch
from hf_flashpatch.kernels import backward, forward, build
import pycuda.driver as drv


def read_global(entry, d, name):
    kern = [kk for (b, e, i), kk in build._kernels.items() if e == entry and dict(b.defines).get("HEAD_DIM") == str(d)]
    out = []
    with build._InContext(0):
        for kk in kern:
            ptr, size = kk.module.get_global(name)
            buf = np.zeros(size // 8, dtype=np.uint64)
            drv.memcpy_dtoh(buf, ptr)
            drv.memset_d8(ptr, 0, size)
            out.append(buf)
    return out


def clear(entry, d, names):
    for n in names:
        read_global(entry, d, n)


def rand(*shape, g):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g)


def bwd_case(d, causal, batch, seqlen, heads):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, do, k, v = (rand(batch, seqlen, heads, d, g=g) for _ in range(4))
    out, lse = forward.attention_forward(q, k, v, causal=causal, softmax_scale=None, window_left=-1,
                                         window_right=0 if causal else -1, softcap=None)
    for _ in range(3):
        backward.attention_backward(do, q, k, v, out, lse, causal=causal)
    torch.cuda.synchronize()
    clear("bwd_dkdv_dq_atomic", d, ["hfp_blocks"])
    backward.attention_backward(do, q, k, v, out, lse, causal=causal)
    torch.cuda.synchronize()
    (buf,) = read_global("bwd_dkdv_dq_atomic", d, "hfp_blocks")
    t = buf.reshape(-1, 12).astype(np.int64)
    t = t[(t[:, 0] != 0) & (t[:, 5] != 0)]
    c = t[:, :7]
    g0, g1, sm, steps = t[:, 8], t[:, 9], t[:, 10], t[:, 11]
    ghz = np.median((c[:, 5] - c[:, 0]) / np.maximum(g1 - g0, 1))
    us = lambda x: x / ghz / 1000.0
    kv, first, step0 = c[:, 1] - c[:, 0], c[:, 2] - c[:, 1], c[:, 6] - c[:, 2]
    rest = (c[:, 3] - c[:, 6]) / np.maximum(steps - 1, 1)
    stores, exitw, total = c[:, 4] - c[:, 3], c[:, 5] - c[:, 4], c[:, 5] - c[:, 0]
    gaps = []
    for s in np.unique(sm):
        idx = np.where(sm == s)[0]
        o = idx[np.argsort(g0[idx])]
        gaps += list(g0[o[1:]] - g1[o[:-1]])
    span = (g1.max() - g0.min()) / 1000.0
    name = f"bwd d{d} {batch}x{seqlen // 1024}k {'causal' if causal else 'full'} heads {heads}"
    print(f"\n== {name}: blocks {len(t)}, clock {ghz:.2f} GHz, kernel span {span:.1f} us")
    print(f"  median us: K/V landed {us(np.median(kv)):.2f}, to first step {us(np.median(first)):.2f}, "
          f"step 0 {us(np.median(step0)):.2f}, later steps {us(np.median(rest)):.3f} each (x{int(np.median(steps))}), "
          f"dK/dV stores {us(np.median(stores)):.2f}, exit wait {us(np.median(exitw)):.2f}, block {us(np.median(total)):.1f}")
    outside = total - (steps * np.median(rest))
    print(f"  block minus steps x median step: median {us(np.median(outside)):.2f} us; "
          f"gap between blocks on an SM: median {np.median(gaps) / 1000:.2f} us, p90 {np.percentile(gaps, 90) / 1000:.2f} us")
    per_sm = np.bincount(sm, weights=total / ghz / 1000.0)
    busy = per_sm[per_sm > 0]
    print(f"  per-SM busy us: min {busy.min():.0f} median {np.median(busy):.0f} max {busy.max():.0f} (span {span:.0f})")


def fwd_case(d, causal, batch, seqlen, heads):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (rand(batch, seqlen, heads, d, g=g) for _ in range(3))
    run = lambda: forward.attention_forward(q, k, v, causal=causal, softmax_scale=None, window_left=-1,
                                            window_right=0 if causal else -1, softcap=None)
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    clear("hfp_attention_forward_sm90_ws", d, ["hfp_works", "hfp_ctas"])
    run()
    torch.cuda.synchronize()
    works = [b for b in read_global("hfp_attention_forward_sm90_ws", d, "hfp_works") if b.any()]
    ctas = [b for b in read_global("hfp_attention_forward_sm90_ws", d, "hfp_ctas") if b.any()]
    w = works[0].reshape(1024, 48, 3, 5).astype(np.int64)
    c = ctas[0].reshape(1024, 4).astype(np.int64)
    used = np.where(c[:, 0] != 0)[0]
    span = (c[used, 3].max() - c[used, 0].min()) / 1000.0
    name = f"fwd d{d} {batch}x{seqlen // 1024}k {'causal' if causal else 'full'} heads {heads}"
    qwait, body, gap, tiles, per_tile = [], [], [], [], []
    nworks = []
    for b in used:
        n = int(np.sum(w[b, :, 0, 0] != 0))
        nworks.append(n)
        for i in range(n):
            for wg in range(2):
                qwait.append(w[b, i, wg, 1] - w[b, i, wg, 0])
                body.append(w[b, i, wg, 3] - w[b, i, wg, 1])
                tiles.append(w[b, i, wg, 4])
                if i + 1 < n:
                    gap.append(w[b, i + 1, wg, 0] - w[b, i, wg, 3])
    qwait, body, tiles = np.array(qwait), np.array(body), np.array(tiles)
    ok = tiles > 0
    # fit body = a + b * tiles over the works (a: the per-work cost of the loop's ends and the store)
    A = np.vstack([np.ones(ok.sum()), tiles[ok]]).T
    (a, b_), *_ = np.linalg.lstsq(A, body[ok].astype(float), rcond=None)
    print(f"\n== {name}: CTAs {len(used)}, works per CTA median {int(np.median(nworks))} (max {max(nworks)}), "
          f"kernel span {span:.1f} us")
    print(f"  clocks median: Q wait {int(np.median(qwait))}, work body {int(np.median(body))} over "
          f"{int(np.median(tiles))} key tiles ({int(np.median(body[ok] / tiles[ok]))} a tile), gap to next work "
          f"{int(np.median(gap)) if gap else 0}; fit body = {a:.0f} + {b_:.0f} x tiles")
    ends = c[used, 3] - c[used, 0]
    print(f"  CTA busy us: min {ends.min() / 1000:.0f} median {np.median(ends) / 1000:.0f} max {ends.max() / 1000:.0f}")


def guarded(fn, *args):
    try:
        fn(*args)
    except Exception:
        import traceback
        traceback.print_exc()


which = sys.argv[1] if len(sys.argv) > 1 else "all"
if which in ("all", "bwd"):
    for args in [(128, False, 8, 2048, 16), (128, False, 4, 4096, 16), (128, False, 1, 16384, 16),
                 (128, True, 1, 16384, 16), (64, False, 8, 2048, 32), (64, False, 4, 4096, 32)]:
        guarded(bwd_case, *args)
if which in ("all", "fwd"):
    for args in [(128, False, 8, 2048, 16), (128, False, 1, 16384, 16), (128, True, 8, 2048, 16),
                 (64, True, 8, 2048, 32), (64, True, 1, 16384, 32)]:
        guarded(fwd_case, *args)
