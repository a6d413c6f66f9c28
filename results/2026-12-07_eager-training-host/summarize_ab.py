"""Medians, minima and per-round ratios (new / main) of call 8's host_ab.log."""
import statistics as st
import sys

rows = {"main": [], "new": []}
for line in open(sys.argv[1] if len(sys.argv) > 1 else "call8/host_ab.log"):
    parts = line.split()
    if parts and parts[0] in rows:
        rows[parts[0]].append([float(parts[i]) for i in (2, 4, 6, 9)])  # "sdpa fwd+bwd" is two words
names = ["fwd+bwd", "_launch", "_kernel_backward", "sdpa fwd+bwd"]
for tree, r in rows.items():
    print(f"{tree:5s}", " | ".join(f"{n} median {st.median(c[i] for c in r):6.1f} min {min(c[i] for c in r):6.1f}"
                                   for i, n in enumerate(names)))
pairs = list(zip(rows["main"], rows["new"]))
for i, n in enumerate(names):
    ratios = sorted(b[i] / a[i] for a, b in pairs)
    print(f"{n:18s} new / main by round: {' '.join(f'{x:.2f}' for x in ratios)}  median {st.median(ratios):.2f}")
