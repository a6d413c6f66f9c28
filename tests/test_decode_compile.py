"""CPU check of the decode kernels: every build of the default variant (head dims x dtypes x
contiguous / block-table / slot addressing x softcap) and kv_append compile for sm_90a without
register spills, and so do the D=128 builds of the candidates with builds of their own
(``CANDIDATE_VARIANTS``: the head dim they are measured at). The other variants are compiled by
``hf-flashpatch doctor --compile`` and on the GPU by ``tests/gpu/test_decode.py``. Also the
split-KV heuristic's launch-side ``min_waves`` policy (plain arithmetic)."""

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from ptxas_report import spills_by_entry

from hf_flashpatch.kernels.build import compile_cubin, find_nvcc
from hf_flashpatch.kernels.decode import (
    ADDRESSING,
    DEFAULT_VARIANT,
    SUPPORTED_HEAD_DIMS,
    all_builds,
    choose_num_splits,
    variant_config,
)

needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found")
CANDIDATE_VARIANTS = ("ahead", "ahead_l2", "pages_waves2", "pages_qregs_waves2", "ahead_qregs_waves2")


def _default_builds():
    builds = [
        variant_config(d, bf16, addressing, softcap, DEFAULT_VARIANT).build()
        for d in SUPPORTED_HEAD_DIMS
        for bf16 in (True, False)
        for addressing in ADDRESSING
        for softcap in (False, True)
    ]
    candidates = [
        variant_config(128, bf16, addressing, softcap, variant).build()
        for variant in CANDIDATE_VARIANTS
        for bf16 in (True, False)
        for addressing in ADDRESSING
        for softcap in (False, True)
    ]
    shipped = set(all_builds())
    builds = list(dict.fromkeys(builds + candidates))  # the default may be one of the candidates
    assert set(builds) <= shipped
    return builds + [b for b in shipped if b.source == "kv_append.cu"]


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
    # launch-side variants reuse the compiled kernel of the variant they extend
    assert variant_config(128, True, "block_table", False, "waves2").build() == (
        variant_config(128, True, "block_table", False, "coalesced").build()
    )
    assert variant_config(128, True, "block_table", False, "ahead_waves2").build() == (
        variant_config(128, True, "block_table", False, "ahead").build()
    )


def test_page_tiles_switch_only_changes_the_block_table_build():
    """``page_tiles`` addresses pages, so the contiguous and slot builds of a variant with it are the
    builds of the variant it extends (no duplicate cubins), and only the block-table build differs."""
    for addressing in ("contiguous", "slot"):
        assert variant_config(128, True, addressing, False, "pages_waves2").build() == (
            variant_config(128, True, addressing, False, "ahead_waves2").build()
        )
    paged = variant_config(128, True, "block_table", False, "pages_waves2").build()
    assert paged != variant_config(128, True, "block_table", False, "ahead_waves2").build()
    assert ("PAGE_TILES", "1") in paged.defines
    # D = 32 keeps the per-key copy form (its page-tile build spills in the prologue)
    assert variant_config(32, True, "block_table", False, "pages_waves2").build() == (
        variant_config(32, True, "block_table", False, "ahead_waves2").build()
    )
