"""Every backward kernel variant compiles for sm_90a without register spills (CPU only: needs nvcc).

Builds come from :func:`hf_flashpatch.kernels.backward.all_builds` (head dims 32/64/96/128/256 x
bf16/fp16 x softcap); each holds the preprocess, dK/dV (atomic-dQ and deterministic), dQ and convert
kernels. ptxas' report must show every entry point with 0 bytes of spill stores and loads.
"""

import os
import re
from concurrent.futures import ThreadPoolExecutor

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
