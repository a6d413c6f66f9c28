"""The real check, small: SmolLM2-135M (3 KV heads) -> MQA on held-out Wikipedia text, then a short uptraining.

Runs ``scripts/gqa_quality.py`` with a few thousand eval tokens and a ~12k-token uptraining budget
(a couple of CPU minutes) and checks the ordering the method predicts: mean pooling beats a random
re-initialisation, and uptraining improves the mean-pooled model. Skips where the SmolLM2 wheel or
gensim (the text) is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from real_model import require_smollm2

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_mqa_mean_beats_random_and_uptraining_helps(tmp_path):
    require_smollm2("gensim")
    out = tmp_path / "quality"
    env = os.environ | {"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                        "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(
        [sys.executable, "scripts/gqa_quality.py", "--out", str(out), "--kv-heads", "1",
         "--eval-sequences", "6", "--eval-seq-len", "512", "--uptrain-tokens", "12288",
         "--seq-len", "256", "--batch-size", "8"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600,  # a hang guard, not a speed limit
    )
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    results = json.loads((out / "results.json").read_text())
    ppl = {row["model"]: row["perplexity"] for row in results["rows"]}
    exact = results["exactness"]
    assert exact["pooled_back_weights_identical"] and exact["pooled_back_logits_identical"]
    assert exact["mha_twin_max_abs_logit_diff"] < 1e-4
    assert results["kv_cache_reduction"] == 3
    assert ppl["original"] < 100  # the real model on real text
    assert ppl["mean-pooled"] < ppl["random-pooled"]
    assert ppl["mean-pooled + uptrained"] < ppl["mean-pooled"] / 2
    assert ppl["original"] < ppl["mean-pooled + uptrained"]
    assert "| mean-pooled + uptrained | 1 |" in (out / "table.md").read_text()
