"""Stall samples grouped by how often an instruction ran (once a work, once a key tile, ...), from ncu's source page.

Instructions executed as often as (math warps) x (works) run once a work and warp: the per-work code. Usage:
python work_classes.py DIR  (reads DIR/*.sass.csv)
"""
import collections
import csv
import glob
import os
import sys

for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.sass.csv"))):
    with open(path) as f:
        rows = list(csv.reader(f))
    head = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    cols = rows[head]
    ix = {c: i for i, c in enumerate(cols)}
    samples, count, total = collections.Counter(), collections.Counter(), 0
    for r in rows[head + 1:]:
        if len(r) != len(cols):
            continue
        executed = int(r[ix["Instructions Executed"]] or 0)
        s = int(r[ix["Warp Stall Sampling (All Samples)"]] or 0)
        samples[executed] += s
        count[executed] += 1
        total += s
    print(os.path.basename(path)[:-9] + ": " + "; ".join(
        f"{e} execs x {count[e]} instrs {100 * samples[e] / total:.1f} %" for e, _ in samples.most_common(5)))
