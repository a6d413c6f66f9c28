"""Plot a GQA recovery curve (``recovery.json`` from ``scripts/gqa_recovery_curve.py``) as a hand-written SVG.

x: training tokens (millions, linear); y: held-out perplexity (log scale, so higher perplexity is
higher on the page: a smaller SVG y). One polyline with markers per run, a dashed line at the
unconverted model's perplexity, a legend. No third-party dependency.

    python scripts/plot_recovery.py results/2026-12-01_380bfda_gqa-recovery-curve/recovery.json \\
        docs/img/gqa_recovery_curve.svg
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

WIDTH, HEIGHT = 760, 460
LEFT, RIGHT, TOP, BOTTOM = 72, 20, 56, 52  # margins around the plot area
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def nice_step(span: float, most: int = 8) -> float:
    """The smallest 1-2-5 step that splits ``span`` into at most ``most`` intervals."""
    exponent = math.floor(math.log10(span / most))
    return next(m * 10.0 ** e for e in (exponent, exponent + 1) for m in (1, 2, 5) if span / (m * 10.0 ** e) <= most)


def reference_perplexity(data: dict) -> float | None:
    """The unconverted model's perplexity: ``teacher_perplexity`` (what gqa_recovery_curve.py stores);
    for a file without it, the control run's step-0 eval, which measures the same unconverted model."""
    if data.get("teacher_perplexity"):
        return float(data["teacher_perplexity"])
    for run in data["runs"]:
        if run.get("name", "").startswith("control") and run.get("evals") and run["evals"][0]["tokens"] == 0:
            return float(run["evals"][0]["perplexity"])
    return None


def text(x: float, y: float, content: str, extra: str = "", size: int = 12) -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" font-family="sans-serif" font-size="{size}" {extra}>{escape(content)}</text>'


def render(data: dict, source: str = "recovery.json") -> str:
    runs = data.get("runs")
    if not runs:
        raise SystemExit(f"plot_recovery.py: error: {source} has no runs to plot")
    reference = reference_perplexity(data)
    series = []
    for run in runs:
        points = [(e["tokens"] / 1e6, e["perplexity"]) for e in run.get("evals", [])]
        if any(not (math.isfinite(p) and p > 0) for _, p in points):
            raise SystemExit(f"plot_recovery.py: error: {source}: run {run.get('name')!r} has a perplexity "
                             "that is not a positive finite number")
        series.append((str(run.get("name", f"run {len(series) + 1}")), points))
    values = [p for _, points in series for _, p in points] + ([reference] if reference else [])
    if not values:
        raise SystemExit(f"plot_recovery.py: error: {source}: its runs have no evaluations")
    x_last = max([x for _, points in series for x, _ in points] + [1e-6])  # millions of tokens
    x_step = nice_step(x_last)
    x_max = x_step * math.ceil(x_last / x_step)
    lo, hi = math.log10(min(values)), math.log10(max(values))
    pad = max(0.05 * (hi - lo), 0.05)
    lo, hi = lo - pad, hi + pad
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def sx(x: float) -> float:
        return LEFT + plot_w * x / x_max

    def sy(p: float) -> float:
        return TOP + plot_h * (hi - math.log10(p)) / (hi - lo)

    model = Path(str(data.get("model", "model"))).name
    heads = f", {data['kv_heads_before']} → {data['kv_heads_after']} KV heads" if "kv_heads_after" in data else ""
    detail = "held-out perplexity" + (f" on {data['eval_tokens']:,} tokens" if data.get("eval_tokens") else "") + (
        f" of {data['data']}" if data.get("data") else "") + (f"; {data['device']}" if data.get("device") else "")
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
           text(WIDTH / 2, 22, f"GQA recovery: {model}{heads}", 'text-anchor="middle" class="title"', 15),
           text(WIDTH / 2, 40, detail, 'fill="#555" text-anchor="middle"'),
           f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#333"/>']
    for k in range(0, round(x_max / x_step) + 1):  # x ticks
        x = sx(k * x_step)
        out.append(f'<line x1="{x:.1f}" y1="{TOP + plot_h}" x2="{x:.1f}" y2="{TOP + plot_h + 5}" stroke="#333"/>')
        out.append(text(x, TOP + plot_h + 19, f"{k * x_step:g}", 'text-anchor="middle" class="xtick"'))
    for decade in range(math.floor(lo), math.ceil(hi) + 1):  # y ticks: 1, 2, 5 x 10^k inside the range
        for mantissa in (1, 2, 5):
            p = mantissa * 10.0 ** decade
            if lo <= math.log10(p) <= hi:
                y = sy(p)
                out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + plot_w}" y2="{y:.1f}" stroke="#e4e4e4"/>')
                out.append(text(LEFT - 6, y + 4, f"{p:g}", 'text-anchor="end" class="ytick"'))
    out.append(text(LEFT + plot_w / 2, HEIGHT - 12, "training tokens (millions)", 'text-anchor="middle"'))
    out.append(text(18, TOP + plot_h / 2, "held-out perplexity (log scale)",
                    f'text-anchor="middle" transform="rotate(-90 18 {TOP + plot_h / 2})"'))
    legend = [(name, COLORS[i % len(COLORS)], "") for i, (name, _) in enumerate(series)]
    if reference:
        y = sy(reference)
        out.append(f'<line class="reference" x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + plot_w}" y2="{y:.1f}" '
                   f'stroke="#555" stroke-width="1.5" stroke-dasharray="6 4"/>')
        legend.append((f"unconverted model: {reference:.2f}", "#555", ' stroke-dasharray="6 4"'))
    for i, (name, points) in enumerate(series):
        color = COLORS[i % len(COLORS)]
        coords = " ".join(f"{sx(x):.1f},{sy(p):.1f}" for x, p in points)
        out.append(f'<g class="run" fill="{color}"><title>{escape(name)}</title>'
                   f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2"/>')
        out += [f'<circle cx="{sx(x):.1f}" cy="{sy(p):.1f}" r="3.5"/>' for x, p in points] + ["</g>"]
    box_w = 46 + 6.6 * max(len(name) for name, _, _ in legend)  # legend: top right of the plot area
    box_x, box_y = LEFT + plot_w - box_w - 10, TOP + 10
    out.append(f'<g class="legend"><rect x="{box_x:.1f}" y="{box_y}" width="{box_w:.1f}" '
               f'height="{18 * len(legend) + 8}" fill="white" stroke="#bbb"/>')
    for i, (name, color, dash) in enumerate(legend):
        y = box_y + 16 + 18 * i
        out.append(f'<line x1="{box_x + 8:.1f}" y1="{y - 4}" x2="{box_x + 34:.1f}" y2="{y - 4}" stroke="{color}" '
                   f'stroke-width="2"{dash}/>')
        out.append(text(box_x + 40, y, name, f"data-name={quoteattr(name)}"))
    out += ["</g>", "</svg>"]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        raise SystemExit("usage: python scripts/plot_recovery.py RECOVERY_JSON OUT_SVG")
    source, target = Path(argv[0]), Path(argv[1])
    try:
        data = json.loads(source.read_text())
    except (OSError, ValueError) as error:
        raise SystemExit(f"plot_recovery.py: error: cannot read {source}: {error}") from None
    if not isinstance(data, dict):
        raise SystemExit(f"plot_recovery.py: error: {source} is not a recovery.json object")
    svg = render(data, str(source))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(svg, encoding="utf-8")
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
