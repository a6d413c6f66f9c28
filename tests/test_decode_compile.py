"""CPU check of the decode kernels: every shipped build (head dims, and q/k 192 with v 128, x dtypes x
contiguous / block-table / slot addressing x softcap) and kv_append compile for sm_90a without register spills. Also the split-KV
heuristic's ``min_waves`` policy (plain arithmetic)."""

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from ptxas_report import spills_by_entry

from hf_flashpatch.kernels.build import compile_cubin, find_nvcc, shared_bytes_of
from hf_flashpatch.kernels.decode import MIN_WAVES, DecodeConfig, all_builds, choose_num_splits

needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found")


def _default_builds():
    builds = all_builds() + all_builds("sm_80")  # Hopper, and every other GPU
    # per arch: (6 head dims, 80 among them, + the 192/128 pair) x dtypes x addressing x softcap, and kv_append
    assert len(builds) == len(set(builds)) == 2 * (7 * 2 * 3 * 2 + 1)
    assert {dict(b.defines).get("HEAD_DIM") for b in builds} == {"32", "64", "80", "96", "128", "192", "256", None}
    return builds


@pytest.mark.kernel_build
@needs_nvcc
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
        if build.source == "decode.cu":  # the split kernel's stated shared memory fits a Hopper block
            assert 0 < shared_bytes_of(cubin, "hfp_decode_split") <= 232448, build
            assert shared_bytes_of(cubin, "hfp_decode_combine") == 0, build


def test_min_waves_split_policy():
    """16 sequences x 8 KV heads = 128 CTAs on 132 SMs x 2 slots: the wave heuristic splits 2 ways (one
    wave); min_waves 2 / 4 split 4 / 8 ways. Grids that already fill a wave are never split."""
    assert choose_num_splits(128, 32768, 132, 2) == 2
    assert choose_num_splits(128, 32768, 132, 2, min_waves=2) == 4
    assert choose_num_splits(128, 32768, 132, 2, min_waves=4) == 8
    for min_waves in (1, 2, 4):
        assert choose_num_splits(512, 4096, 132, 2, min_waves) == 1
        assert choose_num_splits(1024, 2048, 132, 2, min_waves) == 1
        assert choose_num_splits(8, 256, 132, 2, min_waves) == 1  # too few keys to split at all
    assert choose_num_splits(16, 2048, 132, 2, min_waves=4) == 2048 // 256  # capped by keys per split
    assert MIN_WAVES == 2  # what the launcher asks for


def test_page_tiles_are_the_block_table_builds_but_d32():
    """The copy form is derived in cuda/decode_common.cuh (PAGE_TILES) from the addressing and the head
    dim, so the Python config passes no switch: one build per (head dim, dtype, addressing, softcap)."""
    paged = DecodeConfig(128, True, "block_table", False).build()
    assert dict(paged.defines) == {"HEAD_DIM": "128", "ELEM_BF16": "1", "KV_ADDRESSING": "1", "SOFTCAP": "0",
                                   "STAGES": "3"}  # fmt: skip
