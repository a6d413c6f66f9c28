"""Compile ``cuda/*.cu`` to cubins (on-disk cache) and launch them through PyCUDA on torch's stream.

- **Compile.** :class:`KernelBuild` (a frozen dataclass: source file, ``-D`` macros from a kernel's
  config dataclass, arch) is the cache key together with a hash of every ``cuda/`` source and the
  nvcc version. Cubins are written to a temporary file and ``os.replace``-d into place, so two
  processes compiling the same kernel at once never see a torn file. nvcc is invoked directly (what
  ``pycuda.compiler`` does too), so the same function serves CI's CPU-only compile check.
- **Load.** PyCUDA's ``module_from_buffer`` in torch's primary context (never a second context).
- **Launch.** ``prepared_async_call``. When torch runs on the legacy default stream and is not
  capturing a CUDA graph, the kernel goes on stream 0. Otherwise it forks onto a PyCUDA stream that
  is wrapped as a ``torch.cuda.ExternalStream`` and joined back (``wait_stream`` both ways), which
  orders correctly on side streams and records into ``torch.cuda.graph`` captures.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import KernelUnsupported

_PACKAGE_DIR = Path(__file__).resolve().parent.parent


def cuda_source_dir() -> Path:
    """The kernel sources: ``hf_flashpatch/_cuda`` in an installed wheel, ``cuda/`` in a checkout."""
    for candidate in (_PACKAGE_DIR / "_cuda", _PACKAGE_DIR.parent / "cuda"):
        if (candidate / "primitives.cuh").is_file():
            return candidate
    raise FileNotFoundError(f"hf_flashpatch CUDA sources not found next to {_PACKAGE_DIR}")


def cache_dir() -> Path:
    """``$HF_FLASHPATCH_CACHE``, else ``~/.cache/hf_flashpatch``."""
    root = os.environ.get("HF_FLASHPATCH_CACHE") or Path.home() / ".cache" / "hf_flashpatch"
    return Path(root)


def find_nvcc() -> str | None:
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home and (Path(cuda_home) / "bin" / "nvcc").is_file():
        return str(Path(cuda_home) / "bin" / "nvcc")
    return shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").is_file() else None
    )


@functools.lru_cache(maxsize=None)
def nvcc_version(nvcc: str) -> str:
    return subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout.strip()


def arch_for_capability(major: int, minor: int) -> str:
    """``sm_90a`` on Hopper (wgmma/setmaxnreg need the ``a`` target), ``sm_XY`` on Ampere and Ada."""
    if major < 8:
        raise KernelUnsupported(f"hf_flashpatch kernels need compute capability >= 8.0, got {major}.{minor}")
    return "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"


def variant_from_env(env_var: str, default: str, names) -> str:
    """The kernel variant named by ``$env_var`` (unset or empty: ``default``), checked against ``names``
    (read at every launch, so a CUDA graph captured after setting it records that variant)."""
    name = os.environ.get(env_var) or default
    if name not in names:
        raise ValueError(f"{env_var} must be one of {sorted(names)}, got {name!r}")
    return name


@dataclass(frozen=True)
class KernelBuild:
    """What to compile: one ``cuda/`` source with ``-D`` macros. Kernels make these from their config."""

    source: str
    defines: tuple[tuple[str, str], ...] = ()
    arch: str = "sm_90a"

    def nvcc_command(self, nvcc: str, out_path: str, extra: tuple[str, ...] = ()) -> list[str]:
        gencode = f"-gencode=arch=compute_{self.arch[3:]},code={self.arch}"
        return [
            nvcc, "-cubin", gencode, "-O3", "-std=c++17", "--use_fast_math",
            f"-I{cuda_source_dir()}",
            *[f"-D{name}={value}" for name, value in self.defines],
            *extra, "-o", out_path, str(cuda_source_dir() / self.source),
        ]  # fmt: skip


@functools.lru_cache(maxsize=1)
def _sources_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(cuda_source_dir().glob("*.cu*")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def compile_cubin(build: KernelBuild, *, verbose_ptxas: bool = False) -> tuple[bytes, str]:
    """Return ``(cubin, ptxas_report)``, from the disk cache when possible (report empty then)."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise KernelUnsupported("nvcc not found (set CUDA_HOME or put nvcc on PATH) to compile the kernels")
    key = hashlib.sha256(repr((build, _sources_digest(), nvcc_version(nvcc))).encode()).hexdigest()[:32]
    target = cache_dir() / f"{Path(build.source).stem}-{key}.cubin"
    if target.is_file() and not verbose_ptxas:
        return target.read_bytes(), ""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".cubin.tmp")
    os.close(fd)
    try:
        extra = ("-Xptxas", "-v") if verbose_ptxas else ()
        proc = subprocess.run(build.nvcc_command(nvcc, tmp, extra), capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"nvcc failed for {build}:\n{proc.stderr[-4000:]}")
        cubin = Path(tmp).read_bytes()
        os.replace(tmp, target)  # atomic: concurrent compilers write the same bytes, never a torn file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return cubin, proc.stderr


# ---------------------------------------------------------------------------------------- launch

_lock = threading.Lock()
_contexts: dict[int, object] = {}
_side_streams: dict[int, object] = {}


def _pycuda():
    try:
        import pycuda.driver as driver
    except Exception as exc:  # ImportError, or no libcuda.so.1
        raise KernelUnsupported(f"pycuda is not importable ({exc}); pip install 'hf_flashpatch[cuda]'") from exc
    return driver


def _primary_context(device_index: int):
    """torch's primary context for the device, retained once (shared, never a second context)."""
    with _lock:
        ctx = _contexts.get(device_index)
        if ctx is None:
            driver = _pycuda()
            driver.init()
            torch.cuda.init()
            ctx = driver.Device(device_index).retain_primary_context()
            _contexts[device_index] = ctx
        return ctx


class _InContext:
    """Make the device's primary context current in PyCUDA's (thread-local) view for a block."""

    def __init__(self, device_index: int):
        self.ctx = _primary_context(device_index)

    def __enter__(self):
        self.ctx.push()

    def __exit__(self, *exc):
        _pycuda().Context.pop()


_ARG_CASTS = {"P": np.uintp, "i": np.int32, "I": np.uint32, "q": np.int64, "f": np.float32}


class Kernel:
    """A loaded kernel entry point with a fixed argument signature (PyCUDA ``prepare`` letters:
    ``P`` pointer, ``i`` int32, ``q`` int64, ``f`` float32)."""

    def __init__(self, build: KernelBuild, entry: str, arg_types: str, device_index: int):
        self.build, self.entry, self.arg_types, self.device_index = build, entry, arg_types, device_index
        cubin, _ = compile_cubin(build)
        driver = _pycuda()
        with _InContext(device_index):
            self.module = driver.module_from_buffer(cubin)
            self.function = self.module.get_function(entry)
            self.function.prepare(arg_types)
        self._max_shared_set = 48 * 1024

    def __call__(self, grid, block, *args, shared_bytes: int = 0, tensors=()):
        """Launch on torch's current stream. ``tensors``: every tensor the kernel touches (kept alive
        on the side stream when we fork)."""
        if len(args) != len(self.arg_types):
            raise TypeError(f"{self.entry} takes {len(self.arg_types)} arguments, got {len(args)}")
        cast = [
            _ARG_CASTS[t](0 if a is None else a.data_ptr() if isinstance(a, torch.Tensor) else a)
            for t, a in zip(self.arg_types, args)
        ]
        driver = _pycuda()
        with _InContext(self.device_index):
            if shared_bytes > self._max_shared_set:
                self.function.set_attribute(
                    driver.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, int(shared_bytes)
                )
                self._max_shared_set = shared_bytes
            stream = torch.cuda.current_stream(self.device_index)
            if stream.cuda_stream == 0 and not torch.cuda.is_current_stream_capturing():
                self.function.prepared_async_call(grid, block, None, *cast, shared_size=int(shared_bytes))
                return
            side = _side_stream(self.device_index)
            external = torch.cuda.ExternalStream(side.handle, device=stream.device)
            external.wait_stream(stream)  # kernel starts after torch's queued work
            self.function.prepared_async_call(grid, block, side, *cast, shared_size=int(shared_bytes))
            stream.wait_stream(external)  # torch's later work waits for the kernel
            if not torch.cuda.is_current_stream_capturing():
                for t in tensors:
                    t.record_stream(external)


def _side_stream(device_index: int):
    stream = _side_streams.get(device_index)
    if stream is None:
        stream = _pycuda().Stream(flags=1)  # non-blocking w.r.t. the legacy default stream
        _side_streams[device_index] = stream
    return stream


_kernels: dict[tuple, Kernel] = {}


def get_kernel(build: KernelBuild, entry: str, arg_types: str, device: torch.device) -> Kernel:
    """Compiled, loaded and prepared kernel for ``device`` (memoised per process)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (build, entry, arg_types, index)
    kernel = _kernels.get(key)
    if kernel is None:
        kernel = _kernels[key] = Kernel(build, entry, arg_types, index)
    return kernel


def device_arch(device: torch.device) -> str:
    return arch_for_capability(*torch.cuda.get_device_capability(device))
