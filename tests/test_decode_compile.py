"""CPU check of the decode kernels: every build of the default variant (head dims x dtypes x
contiguous / block-table / slot addressing x softcap) and kv_append compile for sm_90a without
register spills. The other variants are compiled by ``hf-flashpatch doctor --compile`` and on the GPU
by ``tests/gpu/test_decode.py``; CI keeps to the shipped default (60 of the 480 builds)."""

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from ptxas_report import spills_by_entry

from hf_flashpatch.kernels.build import compile_cubin, find_nvcc
from hf_flashpatch.kernels.decode import ADDRESSING, DEFAULT_VARIANT, SUPPORTED_HEAD_DIMS, all_builds, variant_config

pytestmark = pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found")


def _default_builds():
    builds = [
        variant_config(d, bf16, addressing, softcap, DEFAULT_VARIANT).build()
        for d in SUPPORTED_HEAD_DIMS
        for bf16 in (True, False)
        for addressing in ADDRESSING
        for softcap in (False, True)
    ]
    shipped = set(all_builds())
    assert set(builds) <= shipped and len(set(builds)) == len(builds)
    return builds + [b for b in shipped if b.source == "kv_append.cu"]


def test_default_decode_builds_compile_without_spills(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_FLASHPATCH_CACHE", str(tmp_path))
    builds = _default_builds()
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        reports = list(pool.map(lambda b: compile_cubin(b, verbose_ptxas=True), builds))
    for build, (cubin, report) in zip(builds, reports):
        assert cubin[:4] == b"\x7fELF", f"no cubin for {build}"
        spills = spills_by_entry(report)
        assert spills, f"{build}: no entry in the ptxas report"
        spilled = {name: s for name, s in spills.items() if s != (0, 0)}
        assert not spilled, f"{build} spills registers (store, load bytes): {spilled}"
