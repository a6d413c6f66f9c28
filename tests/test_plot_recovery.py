"""``scripts/plot_recovery.py``: a synthetic ``recovery.json`` in, a well-formed SVG out, on the CPU in a second."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "plot_recovery.py"
NS = {"svg": "http://www.w3.org/2000/svg"}


def evals(perplexities: list[float], step_tokens: int = 250_000) -> list[dict]:
    return [{"step": i * 4, "tokens": i * step_tokens, "perplexity": p} for i, p in enumerate(perplexities)]


RUNS = {
    "pca + distilled": [136.5, 52.7, 36.7, 33.9, 31.8],
    "mean & <other> + distilled": [14947.3, 403.7, 92.0, 54.8, 42.1],  # markup characters in a name
    "control: unconverted + fine-tuned (CE)": [29.7, 23.8, 21.1],
}


def plot(tmp_path: Path, results: dict) -> subprocess.CompletedProcess:
    source, target = tmp_path / "recovery.json", tmp_path / "img" / "curve.svg"
    source.write_text(json.dumps(results))
    return subprocess.run([sys.executable, str(SCRIPT), str(source), str(target)],
                          capture_output=True, text=True, timeout=60)


def points(polyline: ET.Element) -> list[tuple[float, float]]:
    return [tuple(map(float, pair.split(","))) for pair in polyline.get("points").split()]


@pytest.mark.parametrize("stored_reference", [True, False])
def test_one_polyline_per_run_in_perplexity_order(tmp_path, stored_reference):
    results = {"model": "/tmp/x/SmolLM2.gguf", "kv_heads_before": 3, "kv_heads_after": 1, "eval_tokens": 4096,
               "runs": [{"name": name, "evals": evals(ppl)} for name, ppl in RUNS.items()]}
    if stored_reference:
        results["teacher_perplexity"] = 30.5
    result = plot(tmp_path, results)
    assert result.returncode == 0, result.stderr
    root = ET.parse(tmp_path / "img" / "curve.svg").getroot()

    groups = root.findall("svg:g[@class='run']", NS)
    assert [g.find("svg:title", NS).text for g in groups] == list(RUNS)
    all_y = {}
    for group, perplexities in zip(groups, RUNS.values()):
        polylines = group.findall("svg:polyline", NS)
        assert len(polylines) == 1
        xy = points(polylines[0])
        assert len(xy) == len(perplexities) == len(group.findall("svg:circle", NS))
        xs, ys = [x for x, _ in xy], [y for _, y in xy]
        assert xs == sorted(xs) and len(set(xs)) == len(xs)  # tokens grow left to right
        all_y.update(zip(perplexities, ys))
    # log scale, higher perplexity drawn higher: strictly smaller SVG y, across every run's points
    by_perplexity = [all_y[p] for p in sorted(all_y)]
    assert by_perplexity == sorted(by_perplexity, reverse=True) and len(set(by_perplexity)) == len(by_perplexity)
    # on a log scale equal ratios are equal distances
    y = {p: all_y[p] for p in (14947.3, 136.5, 29.7)}
    ratio = (y[136.5] - y[29.7]) / (y[14947.3] - y[136.5])
    assert ratio == pytest.approx(math.log(136.5 / 29.7) / math.log(14947.3 / 136.5), rel=0.01)

    legend = [t.text for t in root.findall("svg:g[@class='legend']/svg:text", NS)]
    assert legend[:len(RUNS)] == list(RUNS)
    reference = root.find("svg:line[@class='reference']", NS)
    assert reference.get("stroke-dasharray")
    expected = 30.5 if stored_reference else 29.7  # else the control run's step-0 eval
    assert legend[-1] == f"unconverted model: {expected:.2f}"
    line_y = float(reference.get("y1"))
    if stored_reference:
        assert all_y[31.8] < line_y < all_y[29.7]  # 31.8 > 30.5 > 29.7
    else:
        assert line_y == pytest.approx(all_y[29.7], abs=0.1)
    assert any("3 → 1 KV heads" in (t.text or "") for t in root.iter(f"{{{NS['svg']}}}text"))


@pytest.mark.parametrize("results", [{"model": "m"}, {"model": "m", "runs": []}])
def test_no_runs_is_a_clear_error(tmp_path, results):
    result = plot(tmp_path, results)
    assert result.returncode != 0
    assert str(tmp_path / "recovery.json") in result.stderr and "no runs" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "img" / "curve.svg").exists()


def test_unreadable_json_and_usage(tmp_path):
    (tmp_path / "recovery.json").write_text("{not json")
    result = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "recovery.json"), str(tmp_path / "o.svg")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "cannot read" in result.stderr and "Traceback" not in result.stderr
    result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "usage" in result.stderr
