"""One benchmark run over every kernel against the peers measured in the same run.

    python scripts/bench.py [--quick] [--only forward,backward,decode,compile] [--out DIR]
    python scripts/bench.py --only mla  # the multi-head latent attention rows alone (bench_mla.py)

Each part (``scripts/bench_forward.py``, ``bench_backward.py``, ``bench_decode.py``, ``bench_compile.py``:
a patched model under ``torch.compile``) appends result
rows (dicts) to one list; this script adds the run's metadata (date, commit, GPU, versions), writes
``bench.json`` and ``bench.png`` to ``--out`` and prints one table per part, ratios included.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

PARTS = ("forward", "backward", "decode", "compile")


def run_metadata() -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        # the caller's statement of the commit wins: the GPU machine's copy may carry a stale .git
        "commit": os.environ.get("HF_FLASHPATCH_COMMIT") or commit or "unknown",
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def print_tables(rows: list[dict]) -> None:
    """One pivot table per (part, panel): a line per x (seqlen, BxL, ...), a column per series."""
    panels: dict[tuple, list[dict]] = {}
    for r in rows:
        panels.setdefault((r.get("part", ""), r.get("panel", "")), []).append(r)
    for (part, panel), sub in panels.items():
        series = list(dict.fromkeys(r.get("series", "") for r in sub))
        xs = list(dict.fromkeys(str(r.get("x", r.get("seqlen", ""))) for r in sub))
        units = sorted({str(r.get("unit", "")) for r in sub})
        print(f"\n== {part}: {panel} [{', '.join(units)}] ==")
        print("x | " + " | ".join(series))
        for x in xs:
            cells = []
            for name in series:
                hit = [r for r in sub if str(r.get("x", r.get("seqlen", ""))) == x and r.get("series", "") == name]
                value = hit[-1].get("value") if hit else None
                cells.append("-" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value))
            print(f"{x} | " + " | ".join(cells))


def plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    numeric = [r for r in rows if isinstance(r.get("value"), (int, float)) and "series" in r and "x" in r]
    if not numeric:
        return
    panels = sorted({r["panel"] for r in numeric if "panel" in r}) or [""]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        sub = [r for r in numeric if r.get("panel", "") == panel]
        for series in sorted({r["series"] for r in sub}):
            pts = sorted((r["x"], r["value"]) for r in sub if r["series"] == series)
            ax.plot([str(p[0]) for p in pts], [p[1] for p in pts], marker="o", label=series)
        ax.set_title(panel, fontsize=9)
        ax.set_ylabel(sub[0].get("unit", ""))
        ax.legend(fontsize=7)
        ax.tick_params(axis="x", labelsize=7, rotation=45)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer sizes (a smoke run)")
    parser.add_argument("--only", default=",".join(PARTS))
    parser.add_argument("--out", default=os.environ.get("OUT", "runs"))
    parser.add_argument("--backward-sweep", action="store_true", help="also time the backward tile candidates")
    parser.add_argument("--max-seqlen", action="store_true", help="also search the longest trainable sequence")
    args = parser.parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = run_metadata()
    print(json.dumps(meta))
    rows: list[dict] = []
    failed = []
    for part in args.only.split(","):
        try:
            module = importlib.import_module(f"bench_{part}")
            part_rows: list[dict] = []
            extra = {
                "backward": dict(sweep=args.backward_sweep, max_seqlen=args.max_seqlen),
            }.get(part, {})
            module.run(part_rows, quick=args.quick, **extra)
            rows += [{"part": part, **r} for r in part_rows]
        except Exception:  # noqa: BLE001 - one part failing must not lose the others' numbers
            failed.append(part)
            traceback.print_exc()
        (out_dir / "bench.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    plot(rows, out_dir / "bench.png")
    print_tables(rows)
    if failed:
        print(f"\nparts that failed: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
