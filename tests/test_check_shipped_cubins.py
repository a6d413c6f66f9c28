"""scripts/check_shipped_cubins.py's comparison of two manifests (no compile): what counts as a difference."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import check_shipped_cubins  # noqa: E402


def manifest(cuobjdump, **builds):
    return {"nvcc": "nvcc 13.0", "cuobjdump": cuobjdump, "builds": {
        key: {"sha256": sha, "sass": f"sass-of-{sha}" if cuobjdump else None, "source": "fwd.cu", "defines": "X=1"}
        for key, sha in builds.items()}}  # fmt: skip


def test_equal_cubins_without_cuobjdump_are_no_difference():
    device, cpu = manifest("cuobjdump 13.0", fwd="a", bwd="b"), manifest(None, fwd="a", bwd="b")
    assert check_shipped_cubins.compare(device, cpu) == []
    assert "bytes are compared" in check_shipped_cubins.compare_note(device, cpu)
    assert check_shipped_cubins.compare_note(device, device) is None


def test_a_changed_cubin_is_named_with_or_without_cuobjdump():
    device = manifest("cuobjdump 13.0", fwd="a", bwd="b")
    for changed in (manifest(None, fwd="a", bwd="c"), manifest("cuobjdump 13.0", fwd="a", bwd="c")):
        lines = check_shipped_cubins.compare(device, changed)
        assert len(lines) == 1 and lines[0].startswith("bwd: ") and "changed" in lines[0]
    lines = check_shipped_cubins.compare(device, manifest(None, fwd="a"))
    assert lines == ["bwd: only in the old manifest"]
