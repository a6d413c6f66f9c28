"""Step timeline of the unmasked d128 chained walk (scratch instrumentation, session 47; not shipped). Session 55:
reads every loaded chained build (the split round's build loads beside the chain's).

    python results/2026-12-06_chain-boundary-timeline/chain_timeline.py TREE [SEQLEN [RAW.npz]]

16k tokens (batch 16384 / SEQLEN, default 2048), 16 heads.
TREE is a copy of the project whose cuda/ carries chain_timeline.diff (main) or chain_timeline_shadow.diff (tag
s47-shadow-boundary-lost): each math warpgroup's first thread of CTAs 0-7
records clock() at five points of every step of its chained walk (loop top, K landed, V landed, S retired, P V
retired, after the store of a work's first step), the producer thread the clock before and after its wait for each
ring tile's K slot. Prints, per key tile index within a work (0 = a work's first step, which stores the work before),
the median step time and where it went, in clocks.
"""

import sys

import numpy as np
import torch

sys.path.insert(0, sys.argv[1])
import pycuda.driver as drv  # noqa: E402

from hf_flashpatch.kernels import build, forward  # noqa: E402


def read_global(name):
    """The clocks of every loaded chained build, summed: only the build that ran wrote any (each is zeroed here)."""
    kernels = [k for (b, e, i), k in build._kernels.items() if dict(b.defines).get("CHAINED_WALK") == "1"]
    assert kernels, "no chained build was loaded"
    total = None
    with build._InContext(0):
        for kernel in kernels:
            ptr, size = kernel.module.get_global(name)
            buf = np.zeros(size // 4, dtype=np.uint32)
            drv.memcpy_dtoh(buf, ptr)
            drv.memset_d8(ptr, 0, size)
            total = buf.astype(np.int64) if total is None else total + buf
    return total


def main() -> None:
    print(forward.__file__, torch.cuda.get_device_name())
    seqlen = int(sys.argv[2]) if len(sys.argv) > 2 else 2048
    batch, tiles = 16384 // seqlen, -(-seqlen // 160)
    q, k, v = (torch.randn(batch, seqlen, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    call = lambda: forward.attention_forward(q, k, v, causal=False, softmax_scale=None, window_left=-1,  # noqa: E731
                                             window_right=-1, softcap=None)
    for _ in range(20):
        call()
    torch.cuda.synchronize()
    read_global("hfp_tl_math"), read_global("hfp_tl_prod")
    call()
    torch.cuda.synchronize()
    math = read_global("hfp_tl_math")
    kept = math.size // (8 * 2 * 6)  # ring tiles the instrumentation keeps (instrument.py 512, instrument_ends.py 1024)
    math = math.reshape(8, 2, kept, 6)
    prod = read_global("hfp_tl_prod").reshape(8, kept, 2)
    if len(sys.argv) > 3:  # the raw clocks, and the walks' end marks where the tree has them (instrument_ends.py)
        try:
            ends = read_global("hfp_tl_end")
        except Exception:  # noqa: BLE001  a tree without the end marks
            ends = np.zeros(0, dtype=np.int64)
        np.savez_compressed(sys.argv[3], math=math, prod=prod, ends=ends)
    steps = min(16 * tiles, kept)  # works a CTA at most x key tiles, as many as the instrumentation keeps
    wrap = lambda x: (x + (1 << 32)) % (1 << 32)  # noqa: E731  clock() is 32-bit
    rows = {}
    for cta in range(8):
        for wg in range(2):
            t = math[cta, wg]
            for j in range(1, steps - 1):
                if t[j, 0] == 0 or t[j + 1, 0] == 0:
                    continue
                rows.setdefault(j % tiles, []).append([
                    wrap(t[j + 1, 0] - t[j, 0]), wrap(t[j, 1] - t[j, 0]), wrap(t[j, 2] - t[j, 1]),
                    wrap(t[j, 3] - t[j, 2]), wrap(t[j, 4] - t[j, 3]), wrap(t[j, 5] - t[j, 4]),
                    wrap(t[j + 1, 0] - t[j, 5]),
                    wrap(t[j, 1] - prod[cta, j, 1]) if prod[cta, j, 1] else -1,
                    wrap(prod[cta, j, 1] - prod[cta, j, 0]) if prod[cta, j, 1] else -1])
    print(f"{batch} x {seqlen}: median clocks of a step, by key tile within a work (CTAs 0-7, both math warpgroups)")
    print(" tile   step  K wait  V wait  S ret  PV ret  store  ->next  K claimed->landed  producer slot wait")
    total = 0
    for i in sorted(rows):
        m = np.median(np.array(rows[i]), axis=0)
        total += m[0]
        print(f"{i:5d} {m[0]:6.0f} {m[1]:7.0f} {m[2]:7.0f} {m[3]:6.0f} {m[4]:7.0f} {m[5]:6.0f} {m[6]:7.0f}"
              f" {m[7]:17.0f} {m[8]:19.0f}")
    steady = np.median([r[0] for i in range(2, tiles - 1) for r in rows.get(i, [])])
    print(f"a work: {total:.0f} clocks = {tiles} x steady {steady:.0f} + {total - tiles * steady:.0f}")


if __name__ == "__main__":
    main()
