"""``hf-flashpatch doctor``: what this machine offers the kernels, and which of them compile and load."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from .kernels import build as kbuild

KERNEL_MODULES = ("forward", "backward", "decode")


def kernel_builds():
    """Every shipped kernel build, by module: ``{name: [KernelBuild, ...]}`` (modules missing here are skipped)."""
    found = {}
    for name in KERNEL_MODULES:
        try:
            module = importlib.import_module(f"hf_flashpatch.kernels.{name}")
        except ImportError:
            continue
        if hasattr(module, "all_builds"):
            found[name] = list(module.all_builds())
    return found


def nvcc_release(nvcc: str) -> str:
    """The ``Cuda compilation tools, release X.Y, VX.Y.Z`` line of ``nvcc --version``.

    Raises RuntimeError, in one line naming ``nvcc``, when it cannot run, fails, hangs or prints no
    such line (a wrapper script gone wrong, another program called nvcc): the doctor's job is to say
    so plainly, where compiling would fail later on a cryptic error. Probed here rather than through
    ``build.nvcc_version``, which caches and raises ``CalledProcessError``.
    """
    try:
        proc = subprocess.run([nvcc, "--version"], capture_output=True, text=True, errors="replace", timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"nvcc at {nvcc} does not run ({type(exc).__name__}: {exc})") from None
    output = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        said = f": {output.splitlines()[-1][:200]!r}" if output else ""
        raise RuntimeError(f"nvcc at {nvcc} is broken: '{nvcc} --version' exited with status {proc.returncode}{said}")
    match = re.search(r"^.*release \d+\.\d+.*$", proc.stdout, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"nvcc at {nvcc} is broken: '{nvcc} --version' printed no 'release X.Y' line, "
                           f"got {output[:200]!r}")  # fmt: skip
    return match.group(0).strip()


def main(argv=None) -> int:
    from .cli import ArgumentParser, fail, positive_int

    parser = ArgumentParser(prog="hf-flashpatch doctor", description=__doc__)
    parser.add_argument("--compile", action="store_true", help="compile every shipped kernel build (uses the disk cache)")
    parser.add_argument("--jobs", type=positive_int, default=os.cpu_count() or 1, help="parallel nvcc processes")
    args = parser.parse_args(argv)

    nvcc = kbuild.find_nvcc()
    nvcc_problem = None
    if nvcc is None:
        nvcc_line = "not found"
    else:
        try:
            nvcc_line = f"{nvcc_release(nvcc)} ({nvcc})"
        except RuntimeError as exc:
            nvcc_problem, nvcc_line = str(exc), "BROKEN (see the error below)"
    print(f"torch        {torch.__version__} (CUDA {torch.version.cuda})")
    print(f"cuda device  {torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'}")
    if torch.cuda.is_available():
        cap = torch.cuda.get_device_capability()
        try:
            arch = kbuild.arch_for_capability(*cap)
        except Exception as exc:  # noqa: BLE001 - report, don't crash
            arch = f"unsupported ({exc})"
        print(f"arch         {arch} (compute capability {cap[0]}.{cap[1]})")
    print(f"nvcc         {nvcc_line}")
    try:
        import pycuda

        print(f"pycuda       {pycuda.VERSION_TEXT}")
    except Exception as exc:  # noqa: BLE001
        print(f"pycuda       not importable ({type(exc).__name__}: {exc})")
    print(f"cache dir    {kbuild.cache_dir()}")
    print(f"sources      {kbuild.cuda_source_dir()}")
    from .kernels import kernels_unavailable_reason

    probe = torch.empty(0, device="cuda") if torch.cuda.is_available() else torch.empty(0)
    reason = kernels_unavailable_reason(probe)
    print(f"kernels      {'usable' if reason is None else 'not usable: ' + reason}")
    if nvcc_problem is not None:
        return fail(parser.prog, f"{nvcc_problem}; fix it or point CUDA_HOME (or PATH) at a working CUDA toolkit")
    jobs = [(module, b) for module, builds in kernel_builds().items() for b in builds]
    if not args.compile or nvcc is None:
        for module, build in jobs:
            print(f"  {module:9s} {build.source} {dict(build.defines)}")
        return 0
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:  # nvcc runs as subprocesses: threads suffice
        statuses = list(pool.map(lambda job: _compile_status(job[1]), jobs))
    for (module, build), status in zip(jobs, statuses):
        print(f"  {module:9s} {build.source} {dict(build.defines)}: {status}")
    return 1 if any(s.startswith("FAILED") for s in statuses) else 0


def _compile_status(build) -> str:
    t0 = time.perf_counter()
    try:
        kbuild.compile_cubin(build)
    except Exception as exc:  # noqa: BLE001 - reported per build
        return f"FAILED: {str(exc).splitlines()[0]}"
    return f"ok {time.perf_counter() - t0:.2f}s"
