"""The build layer on a machine without a GPU: nvcc compile, cache keys, concurrent compiles, packaging.
Faults (broken nvcc, corrupt entries, unwritable cache, killed compiles) are in test_kernel_cache.py."""

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from hf_flashpatch.errors import KernelUnsupported
from hf_flashpatch.kernels import build, kernel_cache

needs_nvcc = pytest.mark.skipif(build.find_nvcc() is None, reason="nvcc not found")
ROOT = Path(__file__).resolve().parent.parent


def test_arch_choice():
    assert build.arch_for_capability(9, 0) == "sm_90a"
    assert build.arch_for_capability(8, 6) == "sm_86"
    with pytest.raises(Exception, match="7.5"):
        build.arch_for_capability(7, 5)


def test_kernel_build_is_a_hashable_cache_key():
    a = build.KernelBuild("selftest.cu", (("SELFTEST_SPIN", "4"),))
    b = build.KernelBuild("selftest.cu", (("SELFTEST_SPIN", "4"),))
    c = build.KernelBuild("selftest.cu", (("SELFTEST_SPIN", "8"),))
    assert a == b and hash(a) == hash(b) and a != c


@needs_nvcc
def test_compile_caches_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_FLASHPATCH_CACHE", str(tmp_path))
    spec = build.KernelBuild("selftest.cu", (("SELFTEST_SPIN", "3"),))
    cubin, report = build.compile_cubin(spec, verbose_ptxas=True)
    assert cubin[:4] == b"\x7fELF" and "selftest_axpy" in report
    (entry,) = tmp_path.iterdir()
    assert entry.name.startswith("selftest-") and entry.suffix == ".entry"
    assert kernel_cache.load(entry) == (cubin, "")  # stored with its size and sha256
    again, report2 = build.compile_cubin(spec)
    assert again == cubin and report2 == ""  # served from the cache


@needs_nvcc
def test_concurrent_compiles_never_tear_the_cache(tmp_path, monkeypatch):
    """Four processes find one corrupt entry at once: each recompiles, and one good entry remains."""
    monkeypatch.setenv("HF_FLASHPATCH_CACHE", str(tmp_path))
    good, _ = build.compile_cubin(build.KernelBuild("selftest.cu", (("SELFTEST_SPIN", "5"),)))
    (entry,) = tmp_path.iterdir()
    entry.write_bytes(entry.read_bytes()[:100])  # truncated
    code = (
        "from hf_flashpatch.kernels import build;"
        "c,_=build.compile_cubin(build.KernelBuild('selftest.cu', (('SELFTEST_SPIN','5'),)));"
        "print(len(c))"
    )
    env = {**os.environ, "HF_FLASHPATCH_CACHE": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    sizes = {p.communicate()[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert sizes == {str(len(good))}
    assert os.listdir(tmp_path) == [entry.name]  # one entry, no temp files
    assert kernel_cache.load(entry) == (good, "")


@needs_nvcc
def test_compile_error_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_FLASHPATCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    # KernelUnsupported: the public API takes the torch fallback and warns with this message
    with pytest.raises(KernelUnsupported, match="(?s)nvcc failed for selftest.cu .*not_a_number"):
        build.compile_cubin(build.KernelBuild("selftest.cu", (("SELFTEST_SPIN", "not_a_number"),)))
    assert not list(tmp_path.iterdir())  # nothing half-written left behind: no entry, no nvcc work dir


def test_wheel_ships_the_cuda_sources(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(ROOT)], check=True)
    wheel = next(tmp_path.glob("hf_flashpatch-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "hf_flashpatch/_cuda/primitives.cuh" in names
    assert "hf_flashpatch/_cuda/selftest.cu" in names
    shipped = {n.rsplit("/", 1)[-1] for n in names if n.startswith("hf_flashpatch/_cuda/")}
    assert {p.name for p in (ROOT / "cuda").glob("*.cu*")} <= shipped
