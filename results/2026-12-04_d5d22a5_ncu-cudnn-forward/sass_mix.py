"""Instruction mix and stall samples per opcode from ncu's source page (`--page source --print-source sass --csv`).

Usage: python sass_mix.py DIR  (reads DIR/*.sass.csv, as `s36c1.sh` wrote them)
"""
import collections
import csv
import glob
import os
import sys

KEYS = ["HGMMA", "MUFU.EX2", "FFMA", "FMUL", "FADD", "FMNMX", "F2FP", "FSEL", "SHFL", "UTMALDG", "UTMASTG", "UBLKCP",
        "LDGSTS", "LDG", "STG", "STS", "STSM", "LDS", "LDSM", "BAR", "SYNCS", "WARPGROUP", "R2UR", "USETMAXREG",
        "WARPSYNC", "ISETP", "IMAD", "LOP3", "BRA"]
STALLS = ["stall_barrier", "stall_long_sb", "stall_math", "stall_wait", "stall_short_sb", "stall_mio", "stall_lg",
          "stall_membar", "stall_sleep", "stall_dispatch", "stall_no_inst", "stall_not_selected", "stall_selected",
          "stall_branch_resolving", "stall_misc", "stall_drain"]


def load(path):
    with open(path) as f:
        rows = list(csv.reader(f))
    head = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    cols = rows[head]
    return [dict(zip(cols, r)) for r in rows[head + 1:] if len(r) == len(cols)]


def opcode(src):
    s = src.strip()
    if s.startswith("@"):
        s = s.split(None, 1)[1]
    return s.split()[0].rstrip(";") if s else ""


for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.sass.csv"))):
    rows = load(path)
    by_key = collections.Counter()
    stall_by_key = collections.Counter()
    stalls = collections.Counter()
    total = samples = 0
    for r in rows:
        n = int(r["Instructions Executed"] or 0)
        smp = int(r["Warp Stall Sampling (All Samples)"] or 0)
        total += n
        samples += smp
        op = opcode(r["Source"])
        key = next((k for k in KEYS if op.startswith(k)), "other")
        by_key[key] += n
        stall_by_key[key] += smp
        for s in STALLS:
            stalls[s] += int(r.get(s) or 0)
    print(f"== {os.path.basename(path)[:-9]}: {len(rows)} SASS lines, {total / 1e6:.2f} M warp instructions, "
          f"{samples} stall samples")
    print("  executed (M) / share of stall samples: " + ", ".join(
        f"{k} {by_key[k] / 1e6:.2f}/{100 * stall_by_key[k] / max(samples, 1):.0f}%" for k in KEYS + ["other"]
        if by_key[k] or stall_by_key[k]))
    print("  stall reasons (% of samples): " + ", ".join(
        f"{s[6:]} {100 * stalls[s] / max(samples, 1):.1f}" for s in STALLS if stalls[s]))
