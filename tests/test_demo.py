"""The demo on the real SmolLM2-135M (GGUF, ~30 s on a 2-core CPU): patched logits match sdpa, it generates."""

import re

import pytest

pytest.importorskip("gguf")


@pytest.mark.slow
def test_demo_on_smollm2_cpu(capsys):
    from hf_flashpatch.demo import FP32_ATOL, main
    from hf_flashpatch.models import smollm2_dir

    try:
        smollm2_dir()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    status = main(["--device", "cpu", "--dtype", "float32", "--max-new-tokens", "4",
                   "--prompt", "The capital of France is", "--prompt", "Once upon a time, in a small village, there"])
    out = capsys.readouterr().out
    assert status == 0, out
    diff = float(re.search(r"max abs diff ([0-9.e+-]+)", out).group(1))
    assert 0.0 <= diff <= FP32_ATOL
    assert "greedy next token agrees for 2/2 prompts" in out
    lengths = [int(n) for n in re.search(r"lengths \[([0-9, ]+)\]", out).group(1).split(",")]
    assert len(set(lengths)) == 2  # prompts of different lengths: a real left-padded batch
    assert re.search(r"generated 8 tokens \(2 x 4\) in [0-9.]+ s: [0-9.]+ tokens/s", out)
    assert "attention path: torch fallback (tensor is on cpu)" in out
