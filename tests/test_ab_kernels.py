"""scripts/ab_kernels.py's CPU side (trees from git revisions, the table when a tree lacks a case), and every
script with a main() runs as a program."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import ab_kernels  # noqa: E402


def test_a_git_revision_is_exported_as_a_tree(tmp_path):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    tree = Path(ab_kernels.export_tree(f"git:{head.stdout.strip()}", tmp_path / "head"))
    assert sorted(p.name for p in tree.iterdir()) == ["cuda", "hf_flashpatch", "scripts"]
    committed = subprocess.run(["git", "-C", str(ROOT), "show", "HEAD:cuda/fwd_hopper_ws.cu"], capture_output=True,
                               check=True).stdout  # fmt: skip
    assert (tree / "cuda" / "fwd_hopper_ws.cu").read_bytes() == committed
    assert ab_kernels.export_tree(str(ROOT), tmp_path / "unused") == str(ROOT)  # a path is used as it is
    assert not (tmp_path / "unused").exists()


def test_a_case_one_tree_lacks_is_a_dash(tmp_path, capsys):
    torch.save({"fwd a": [torch.ones(2)]}, tmp_path / "old_0.json.pt")
    torch.save({"fwd a": [torch.full((2,), 1.5)], "fwd b": [torch.zeros(1)]}, tmp_path / "new_0.json.pt")
    runs = {"old": [{"fwd a (graph)": 2.0}], "new": [{"fwd a (graph)": 1.0, "fwd b": 3.0}]}
    ab_kernels._print_table([("old", "."), ("new", ".")], runs, tmp_path, "title")
    rows = {line.split()[0] + " " + line.split()[1]: line.split()[2:] for line in capsys.readouterr().out.splitlines()
            if line.startswith("fwd")}  # fmt: skip
    assert rows["fwd a"] == ["(graph)", "2.0000", "1.0000", "0.500", "0.5"]  # times, ratio, largest difference
    assert rows["fwd b"] == ["-", "3.0000", "-", "-"]  # the old tree does not serve it


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "scripts").glob("*.py")
                                          if "\ndef main(" in p.read_text()))  # fmt: skip
def test_every_script_with_a_main_runs_as_a_program(script):
    """``python scripts/X.py --help`` prints X's usage: the ``__main__`` guard that calls main() is there
    (without it the script exits 0 having done nothing, as a device run of ab_kernels once did)."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / script), "--help"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)  # fmt: skip
    assert "usage:" in (done.stdout + done.stderr).lower(), (
        f"{script} --help printed no usage (rc {done.returncode}): is main() called under __main__?\n{done.stderr[-2000:]}")


class _RecordingApi:
    """The public functions the A/B cases call, recording their tensors instead of running kernels."""

    def __init__(self):
        self.calls = []

    def flash_attn_func(self, q, k, v, causal=False):
        self.calls.append((q, k, v, causal))
        return q

    def flash_attn_with_kvcache(self, q, k_cache, v_cache, lens, check_inputs=True):
        self.calls.append((q, k_cache, v_cache, check_inputs))
        return q


def test_only_the_selected_cases_are_built_from_inputs_seeded_by_their_name(monkeypatch, capsys):
    """A worker builds the inputs of the cases ``--only`` selects and no others (each A/B process used to build every
    case's, the backward's forward launches included), and a case's inputs do not depend on what else is selected."""
    monkeypatch.setattr(ab_kernels, "DEVICE", "cpu")
    api = _RecordingApi()
    cases = ab_kernels._cases(torch, api, only="^fwd d192.*causal")
    assert list(cases) == ["fwd d192/128 4x4k causal"] and cases["fwd d192/128 4x4k causal"][1] == "graph"
    cases["fwd d192/128 4x4k causal"][0]()
    ((q, k, v, causal),) = api.calls
    assert (q.shape, k.shape, v.shape, causal, q.dtype) == ((4, 4096, 16, 192), (4, 4096, 16, 192), (4, 4096, 16, 128),
                                                            True, torch.bfloat16)  # fmt: skip
    more = ab_kernels._cases(torch, api, only="^fwd d192.*causal|^decode 8x1k contiguous unchecked")
    assert list(more) == ["fwd d192/128 4x4k causal", "decode 8x1k contiguous unchecked"]
    more["fwd d192/128 4x4k causal"][0]()
    assert all(torch.equal(a, b) for a, b in zip(api.calls[0][:3], api.calls[1][:3]))  # the same inputs
    assert more["decode 8x1k contiguous unchecked"][1] == "eager"
    more["decode 8x1k contiguous unchecked"][0]()
    assert api.calls[-1][0].shape == (8, 1, 32, 128) and api.calls[-1][3] is False  # no table check
    assert capsys.readouterr().err == ""


def test_a_case_a_tree_cannot_build_is_left_out_with_its_reason(monkeypatch, capsys):
    """The backward cases launch the forward kernel while building their inputs: where it refuses (here: CPU
    tensors), the case is left out (a "-" in the table) and the reason printed, and the other cases still run."""
    monkeypatch.setattr(ab_kernels, "DEVICE", "cpu")
    cases = ab_kernels._cases(torch, _RecordingApi(), only="^bwd d64 1x4k|^fwd d96")
    assert list(cases) == ["fwd d96 4x4k causal"]
    assert "bwd d64 1x4k 32/8 causal: not built (KernelUnsupported" in capsys.readouterr().err
