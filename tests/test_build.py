"""The build layer on a machine without a GPU: nvcc compile, cache keys, concurrent compiles, packaging."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from hf_flashpatch.kernels import build

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
    files = list(tmp_path.glob("*.cubin"))
    assert len(files) == 1
    again, report2 = build.compile_cubin(spec)
    assert again == cubin and report2 == ""  # served from the cache


@needs_nvcc
def test_concurrent_compiles_never_tear_the_cache(tmp_path):
    code = (
        "from hf_flashpatch.kernels import build;"
        "c,_=build.compile_cubin(build.KernelBuild('selftest.cu', (('SELFTEST_SPIN','5'),)));"
        "print(len(c))"
    )
    env = {**__import__("os").environ, "HF_FLASHPATCH_CACHE": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    sizes = {p.communicate()[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(sizes) == 1
    assert len(list(tmp_path.glob("*.cubin"))) == 1 and not list(tmp_path.glob("*.tmp"))


@needs_nvcc
def test_compile_error_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_FLASHPATCH_CACHE", str(tmp_path))
    with pytest.raises(RuntimeError, match="nvcc failed"):
        build.compile_cubin(build.KernelBuild("selftest.cu", (("SELFTEST_SPIN", "not_a_number"),)))
    assert not list(tmp_path.iterdir())  # nothing half-written left behind


def test_wheel_ships_the_cuda_sources(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(ROOT)], check=True)
    wheel = next(tmp_path.glob("hf_flashpatch-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "hf_flashpatch/_cuda/primitives.cuh" in names
    assert "hf_flashpatch/_cuda/selftest.cu" in names
    shipped = {n.rsplit("/", 1)[-1] for n in names if n.startswith("hf_flashpatch/_cuda/")}
    assert {p.name for p in (ROOT / "cuda").glob("*.cu*")} <= shipped
