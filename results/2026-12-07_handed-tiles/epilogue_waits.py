"""When the other math warpgroup's last S retired, against this warpgroup's epilogue (scratch, CPU only). Reads the raw
clocks that walk_timeline.py saves (../2026-12-07_masked-walk-timeline) from instrumented CTAs 0-7: both warpgroups of
a CTA run on one SM, so their clock() marks compare. E is a work's key loop done (the epilogue's start); the other
warpgroup's last S retired is its mark at the work's last ring tile's K release.

    python epilogue_waits.py RAW.npz [RAW.npz ...]
"""

import sys

import numpy as np


def signed(x):
    """A difference of 32-bit clock() marks, signed."""
    x = (int(x) + (1 << 32)) % (1 << 32)
    return x - (1 << 32) if x >= (1 << 31) else x


def main() -> None:
    for path in sys.argv[1:]:
        raw = np.load(path)
        tile, work = raw["tile"], raw["work"]  # (8, 2, 1024, 3), (8, 2, 64, 5), as walk_timeline.py saves them
        rows = []
        for cta in range(8):
            for wg in range(2):
                w, own, other = work[cta, wg], tile[cta, wg], tile[cta, 1 - wg]
                starts = [i for i in range(64) if w[i, 0] != 0]
                for i in starts[:-1]:
                    if w[i + 1, 0] == 0:
                        continue
                    r0, r1 = int(w[i, 4]), int(w[i + 1, 4])
                    if r1 > 1024 or r1 <= r0:
                        continue
                    start = w[i, 2]  # the key loop done: the epilogue's start
                    rows.append((wg, signed(other[r1 - 1, 1] - start), signed(own[r1 - 1, 2] - start),
                                 signed(own[r1 - 1, 1] - start), signed(w[i, 3] - start),
                                 signed(w[i + 1, 0] - w[i, 3])))
        a = np.array(rows, dtype=float)
        print(path)
        print(" wg  works  otherS-E  ownPV-E  ownS-E  epilogue  ->next   (median clocks; E = key loop done)")
        for wg in (0, 1):
            s = a[a[:, 0] == wg]
            print(f"{wg:3d} {len(s):6d} {np.median(s[:, 1]):9.0f} {np.median(s[:, 2]):8.0f} {np.median(s[:, 3]):7.0f} "
                  f"{np.median(s[:, 4]):9.0f} {np.median(s[:, 5]):7.0f}")
        print("  share of works whose other warpgroup's last S retired after the epilogue began:",
              round(float((a[:, 1] > 0).mean()), 3))


if __name__ == "__main__":
    main()
