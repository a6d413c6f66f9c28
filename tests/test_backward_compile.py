"""Every backward kernel variant compiles for sm_90a without register spills (CPU only: needs nvcc).

Builds come from :func:`hf_flashpatch.kernels.backward.all_builds` (head dims 32/64/96/128/256 x
bf16/fp16 x softcap); each holds the preprocess, dK/dV (atomic-dQ and deterministic), dQ and convert
kernels. ptxas' report must show every entry point with 0 bytes of spill stores and loads, and the
SASS must hold m16n8k16 HMMA and no local-memory traffic (when cuobjdump is at hand).
"""

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hf_flashpatch.kernels.backward import all_builds
from hf_flashpatch.kernels.build import compile_cubin, find_nvcc

ENTRIES = {"bwd_preprocess", "bwd_dkdv_dq_atomic", "bwd_dkdv", "bwd_dq", "bwd_convert_dq"}

pytestmark = pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found")


def _ptxas_spills(report: str) -> dict[str, tuple[int, int]]:
    """{entry: (spill store bytes, spill load bytes)} from an ``-Xptxas -v`` report."""
    spills, entry = {}, None
    for line in report.splitlines():
        found = re.search(r"Compiling entry function '(\w+)'", line)
        if found:
            entry = found.group(1)
        found = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if found and entry is not None:
            spills[entry] = (int(found.group(1)), int(found.group(2)))
    return spills


def test_all_backward_builds_compile_without_spills():
    builds = all_builds()
    assert len(builds) == len(set(builds)) == 20
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        reports = list(pool.map(lambda b: compile_cubin(b, verbose_ptxas=True), builds))
    for build, (cubin, report) in zip(builds, reports):
        assert cubin, f"empty cubin for {build}"
        spills = _ptxas_spills(report)
        assert set(spills) == ENTRIES, f"{build}: entries {sorted(spills)}"
        spilled = {name: s for name, s in spills.items() if s != (0, 0)}
        assert not spilled, f"{build} spills registers (store, load bytes): {spilled}"


def _find_cuobjdump() -> str | None:
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton  # its wheel ships cuobjdump
    except ImportError:
        return None
    candidate = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(candidate) if candidate.is_file() else None


def test_backward_sass_uses_tensor_cores_and_no_local_memory(tmp_path):
    cuobjdump = _find_cuobjdump()
    if cuobjdump is None:
        pytest.skip("cuobjdump not found")
    for build in [b for b in all_builds() if ("HEAD_DIM", "128") in b.defines]:  # bf16/fp16 x softcap
        path = tmp_path / "bwd.cubin"
        path.write_bytes(compile_cubin(build)[0])
        sass = subprocess.run([cuobjdump, "-sass", str(path)], capture_output=True, text=True, check=True).stdout
        assert "HMMA.16816.F32" in sass, f"{build}: no m16n8k16 tensor-core MMA in the SASS"
        assert not re.search(r"\b(LDL|STL)\b", sass), f"{build}: local-memory loads/stores in the SASS"
