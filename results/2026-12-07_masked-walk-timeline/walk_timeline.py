"""Where a masked d128 work's time goes (scratch, with instrument.py's tree; not shipped). Runs the causal d128
forward at 16k tokens (batch 16384 / SEQLEN, 16 heads), then reads the clocks of CTAs 0-7, both math warpgroups.

    python walk_timeline.py TREE SEQLEN [RAW.npz]

Prints, by a work's key tiles, the median of: the work's time (its start to the next work's start), the same in
steady tiles (a steady tile: K landed to the next K landed inside a work, its first and last tiles left out), the
overhead beside its tiles (work - tiles x steady, in steady tiles), and where the overhead lies: the start to the Q
rows landed, the Q rows to the first K landed, the first tile beyond a steady one, the last tile's K to the key
loop's end beyond a steady one, the epilogue, and the epilogue's end to the next work's start. d64's masked build
spills with the marks, so only d128 is read.
"""

import sys

import numpy as np
import torch

sys.path.insert(0, sys.argv[1])
import pycuda.driver as drv  # noqa: E402

from hf_flashpatch.kernels import build, forward  # noqa: E402


def read_global(name):
    """The clocks of every loaded masked warp-specialised build, summed (only the one that ran wrote any); zeroed."""
    kernels = [k for (b, e, i), k in build._kernels.items()
               if b.source == "fwd_hopper_ws.cu" and dict(b.defines).get("HAS_MASK") == "1"]
    assert kernels, "no masked warp-specialised build was loaded"
    total = None
    with build._InContext(0):
        for kernel in kernels:
            ptr, size = kernel.module.get_global(name)
            buf = np.zeros(size // 4, dtype=np.uint32)
            drv.memcpy_dtoh(buf, ptr)
            drv.memset_d8(ptr, 0, size)
            total = buf.astype(np.int64) if total is None else total + buf
    return total


def wrap(x):
    return (x + (1 << 32)) % (1 << 32)  # clock() is 32-bit


def main() -> None:
    print(forward.__file__, torch.cuda.get_device_name())
    seqlen = int(sys.argv[2])
    batch = 16384 // seqlen
    q, k, v = (torch.randn(batch, seqlen, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    call = lambda: forward.attention_forward(q, k, v, causal=True, softmax_scale=None, window_left=-1,  # noqa: E731
                                             window_right=-1, softcap=None)
    for _ in range(20):
        call()
    torch.cuda.synchronize()
    read_global("hfp_tl_tile"), read_global("hfp_tl_work")
    call()
    torch.cuda.synchronize()
    tile = read_global("hfp_tl_tile").reshape(8, 2, 1024, 3)
    work = read_global("hfp_tl_work").reshape(8, 2, 64, 5)
    if len(sys.argv) > 3:
        np.savez_compressed(sys.argv[3], tile=tile, work=work)
    analyse(tile, work, f"{batch} x {seqlen} causal d128")


def analyse(tile, work, label):
    """Print the table from the clocks: tile (8, 2, 1024, 3), work (8, 2, 64, 5)."""
    steady, rows = [], []
    for cta in range(8):
        for wg in range(2):
            w, t = work[cta, wg], tile[cta, wg]
            starts = [i for i in range(64) if w[i, 0] != 0]
            for i in starts[:-1]:
                if w[i + 1, 0] == 0:
                    continue
                r0, r1 = int(w[i, 4]), int(w[i + 1, 4])
                if r1 > 1024 or r1 <= r0:
                    continue
                marks = t[r0:r1, 0]
                steady += [wrap(marks[j + 1] - marks[j]) for j in range(1, len(marks) - 2)]
                first = wrap(t[r0 + 1, 0] - t[r0, 0]) if r1 - r0 > 1 else -1
                rows.append((r1 - r0, wrap(w[i + 1, 0] - w[i, 0]), wrap(w[i, 1] - w[i, 0]),
                             wrap(t[r0, 0] - w[i, 1]), first, wrap(w[i, 2] - t[r1 - 1, 0]),
                             wrap(w[i, 3] - w[i, 2]), wrap(w[i + 1, 0] - w[i, 3])))
    step = float(np.median(steady))
    print(f"{label}: a steady tile {step:.0f} clocks (median of {len(steady)}), {len(rows)} works")
    print(" tiles  works   work  in tiles  overhead  ->Q  Q->K1  first+  last->end+  epilogue  ->next")
    buckets = [(1, 2), (3, 8), (9, 16), (17, 32), (33, 64), (65, 1024)]
    for lo, hi in buckets:
        sel = np.array([r for r in rows if lo <= r[0] <= hi], dtype=np.float64)
        if len(sel) == 0:
            continue
        m = np.median(sel, axis=0)
        n = sel[:, 0]
        over = np.median((sel[:, 1] - n * step) / step)
        first = np.median(sel[sel[:, 4] >= 0, 4]) - step if (sel[:, 4] >= 0).any() else float("nan")
        print(f"{lo:3d}-{hi:<4d}{len(sel):5d} {m[1]:7.0f} {np.median(sel[:, 1] / step):8.2f} {over:9.2f} "
              f"{m[2]:5.0f} {m[3]:6.0f} {first:6.0f} {m[5] - step:10.0f} {m[6]:9.0f} {m[7]:7.0f}")
    allw = np.array(rows, dtype=np.float64)
    print(f"all: overhead {np.median((allw[:, 1] - allw[:, 0] * step) / step):.2f} steady tiles a work (median), "
          f"{(allw[:, 1].sum() - allw[:, 0].sum() * step) / allw[:, 1].sum():.3f} of the works' time")


if __name__ == "__main__":
    main()
