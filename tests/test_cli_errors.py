"""``demo`` and ``doctor`` refuse what they cannot use in one line naming the argument, exit status 2,
no traceback (issue 18, item 9): a folder that is not a model, a checkpoint without a tokenizer, a
device that does not exist here, ``--max-new-tokens 0``, an empty prompt, a broken nvcc (exits 1,
prints garbage, is not executable), ``--jobs 0``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_demo import save_tiny_checkpoint

from hf_flashpatch import demo, doctor

REPO = Path(__file__).absolute().parents[1]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Folders for --model: a good tiny checkpoint, one without a tokenizer, one that is no model."""
    root = tmp_path_factory.mktemp("demo_models")
    not_a_model = root / "notes"
    not_a_model.mkdir()
    (not_a_model / "README.md").write_text("not a model")
    return {
        "good": save_tiny_checkpoint(root / "good"),
        "no_tokenizer": save_tiny_checkpoint(root / "no_tokenizer", with_tokenizer=False),
        "not_a_model": str(not_a_model),
    }


def exit_status(main, argv) -> int:
    """A subcommand's exit status, whether it returns it or argparse exits with it."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error" in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("argv, expected", [
    (["--model", "not_a_model"], "argument --model: {not_a_model} is not a model checkpoint (no config.json)"),
    (["--model", "no_tokenizer"], "argument --model: {no_tokenizer} has no tokenizer (none of tokenizer.json"),
    (["--model", "good", "--device", "tpu"], "argument --device: expected cpu or cuda[:N], got 'tpu'"),
    (["--model", "good", "--device", "cuda"], "argument --device: got 'cuda' but CUDA is not available here"),
    (["--model", "good", "--max-new-tokens", "0"], "argument --max-new-tokens: expected a positive integer, got 0"),
    (["--model", "good", "--prompt", ""], "argument --prompt: a prompt must contain text, got ''"),
    (["--model", "good", "--prompt", "it is", "--prompt", "  "], "argument --prompt: a prompt must contain text"),
], ids=["not_a_model", "no_tokenizer", "tpu", "cuda_without_cuda", "zero_new_tokens", "empty_prompt",
        "blank_prompt"])  # fmt: skip
def test_demo_refuses_in_one_line(checkpoints, monkeypatch, capsys, argv, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # "cuda without CUDA" on a GPU machine too
    argv = [checkpoints.get(arg, arg) for arg in argv]
    assert exit_status(demo.main, ["--device", "cpu", *argv]) == 2
    line = error_line(capsys)
    assert line.startswith("hf-flashpatch demo: error: ") and expected.format(**checkpoints) in line, line
    assert "sentencepiece" not in line


def test_demo_device_error_from_the_shell():
    """End to end through the console entry point: status 2 and one line on stderr, nothing else."""
    proc = subprocess.run([sys.executable, "-m", "hf_flashpatch.cli", "demo", "--device", "tpu"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr == "hf-flashpatch demo: error: argument --device: expected cpu or cuda[:N], got 'tpu'\n"
    assert proc.stdout == ""


FAKE_NVCC = {  # name: (script, what the error line must say)
    "exits_1": ("echo 'nvcc fatal: cannot find libnvvm' >&2\nexit 1", "exited with status 1: 'nvcc fatal: cannot"),
    "garbage": ("printf 'zz\\001\\377 garbage\\n'", "printed no 'release X.Y' line, got 'zz\\x01"),
    "not_executable_format": (None, "does not run (OSError: [Errno 8] Exec format error"),
}


@pytest.mark.parametrize("found_via", ["CUDA_HOME", "PATH"])
@pytest.mark.parametrize("kind", list(FAKE_NVCC))
def test_doctor_reports_a_broken_nvcc_in_one_line(tmp_path, monkeypatch, capsys, kind, found_via):
    script, expected = FAKE_NVCC[kind]
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text(f"#!/bin/sh\n{script}\n" if script else "not a program\n")
    nvcc.chmod(0o755)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    if found_via == "CUDA_HOME":
        monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    else:
        monkeypatch.delenv("CUDA_HOME", raising=False)
        monkeypatch.setenv("PATH", f"{nvcc.parent}{os.pathsep}{os.environ['PATH']}")
    for argv in ([], ["--compile"]):
        assert exit_status(doctor.main, argv) == 2
        line = error_line(capsys)
        assert line.startswith(f"hf-flashpatch doctor: error: nvcc at {nvcc} ") and expected in line, line


def test_doctor_refuses_zero_jobs(capsys):
    assert exit_status(doctor.main, ["--compile", "--jobs", "0"]) == 2
    assert error_line(capsys) == "hf-flashpatch doctor: error: argument --jobs: expected a positive integer, got 0"
