"""Compile ``cuda/*.cu`` to cubins (on-disk cache) and launch them through PyCUDA on torch's stream.

- **Compile.** :class:`KernelBuild` (a frozen dataclass: source file, ``-D`` macros from a kernel's
  config dataclass, arch) is the cache key together with the nvcc flags (``NVCC_PREPEND_FLAGS`` and
  ``NVCC_APPEND_FLAGS`` included: nvcc reads them), a hash of every ``cuda/`` source, the nvcc version
  and the package version. The cache itself (validated entries, atomic durable writes, leftovers of
  killed compiles) is :mod:`.kernel_cache`. nvcc writes into a private temp directory and is invoked
  directly (what ``pycuda.compiler`` does too), so the same function serves CI's CPU-only compile
  check. Every failure of nvcc or of the sources reaches the caller as :class:`KernelUnsupported`,
  which the public API turns into the torch fallback; a cache that cannot be written is no failure.
- **Load.** PyCUDA's ``module_from_buffer`` in torch's primary context (never a second context).
- **Launch.** One precompiled :class:`struct.Struct` per entry point packs the parameter buffer, which
  goes to the driver's launch (PyCUDA's ``_launch_kernel``, where its ``prepared_async_call`` ends; the
  numpy casts that call needs cost more host time than the launch). When torch runs on the legacy
  default stream and is not capturing a CUDA graph, the kernel goes on stream 0. Otherwise it forks
  onto a PyCUDA stream that is wrapped as a ``torch.cuda.ExternalStream`` and joined back
  (``wait_stream`` both ways), which orders correctly on side streams and records into
  ``torch.cuda.graph`` captures.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import struct
import subprocess
import tempfile
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import KernelUnsupported
from . import kernel_cache
from .clusters import resident_clusters
from .cubin_symbols import first_parameter_offset, read_int32
from .sources import Signature, cuda_source_dir, entry_source, kernel_signature

_log = logging.getLogger(__name__)
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
    """``nvcc --version``'s text; KernelUnsupported if that nvcc does not run."""
    try:
        proc = subprocess.run([nvcc, "--version"], capture_output=True, text=True, errors="replace")
    except OSError as exc:  # not executable, vanished, not a binary for this machine
        raise KernelUnsupported(f"nvcc at {nvcc} does not run ({_describe(exc)})") from exc
    if proc.returncode != 0 or not proc.stdout.strip():
        raise KernelUnsupported(
            f"nvcc at {nvcc} does not run: `nvcc --version` exited {proc.returncode} with "
            f"{(proc.stderr or proc.stdout).strip()[-300:]!r}"
        )
    return proc.stdout.strip()


def arch_for_capability(major: int, minor: int) -> str:
    """``sm_90a`` on Hopper (wgmma/setmaxnreg need the ``a`` target), ``sm_XY`` on Ampere and Ada."""
    if major < 8:
        raise KernelUnsupported(f"hf_flashpatch kernels need compute capability >= 8.0, got {major}.{minor}")
    return "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"


NVCC_FLAGS = ("-O3", "-std=c++17", "--use_fast_math")  # every kernel's; part of the cache key
NVCC_ENV_FLAGS = ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS")  # nvcc adds these itself: keyed too


@dataclass(frozen=True)
class KernelBuild:
    """What to compile: one ``cuda/`` source with ``-D`` macros. Kernels make these from their config."""

    source: str
    defines: tuple[tuple[str, str], ...] = ()
    arch: str = "sm_90a"

    def nvcc_flags(self) -> list[str]:
        """The flags that shape the cubin (no paths: where the sources sit does not change it)."""
        gencode = f"-gencode=arch=compute_{self.arch[3:]},code={self.arch}"
        return ["-cubin", gencode, *NVCC_FLAGS, *[f"-D{name}={value}" for name, value in self.defines]]

    def nvcc_command(self, nvcc: str, out_path: str, extra: tuple[str, ...] = ()) -> list[str]:
        return [
            nvcc, *self.nvcc_flags(), f"-I{cuda_source_dir()}",
            *extra, "-o", out_path, str(cuda_source_dir() / self.source),
        ]  # fmt: skip


@functools.lru_cache(maxsize=1)
def _sources_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(cuda_source_dir().glob("*.cu*")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def cache_entry(build: KernelBuild, nvcc: str) -> Path:
    """The cache file for ``build``, keyed by everything that changes the cubin: the build (source,
    defines, arch), the nvcc flags and nvcc's flag variables, the ``cuda/`` sources, the nvcc version,
    the package version and the entry format."""
    from .. import __version__

    key = (
        build, build.nvcc_flags(), tuple(os.environ.get(name, "") for name in NVCC_ENV_FLAGS),
        _sources_digest(), nvcc_version(nvcc), __version__, kernel_cache.FORMAT,
    )  # fmt: skip
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:32]
    return cache_dir() / f"{Path(build.source).stem}-{digest}{kernel_cache.ENTRY_SUFFIX}"


def compile_cubin(build: KernelBuild, *, verbose_ptxas: bool = False) -> tuple[bytes, str]:
    """Return ``(cubin, ptxas_report)``, from the disk cache when it holds a valid entry (report empty
    then). An invalid entry (truncated, empty, garbled) is recompiled and replaced.

    Raises :class:`KernelUnsupported` (never OSError or CalledProcessError) when nvcc is missing,
    does not run, fails, or writes no cubin. A cache that cannot be written (read-only, full disk)
    does not fail the kernel: the cubin is compiled in a temp dir and served from memory, with one
    warning per cache directory and cause, and every process compiles it again.
    """
    nvcc = find_nvcc()
    if nvcc is None:
        raise KernelUnsupported("nvcc not found (set CUDA_HOME or put nvcc on PATH) to compile the kernels")
    try:
        target = cache_entry(build, nvcc)
    except OSError as exc:  # the sources are missing or unreadable
        raise KernelUnsupported(f"reading the CUDA sources failed ({type(exc).__name__}: {exc})") from exc
    if not verbose_ptxas:  # the report comes only from a real compile
        cubin, why = kernel_cache.load(target)
        if cubin is not None:
            return cubin, ""
        if why != "missing":
            _log.warning("hf_flashpatch: kernel cache entry %s is invalid (%s); recompiling it", target, why)
    cubin, report = _run_nvcc(build, nvcc, verbose_ptxas)
    try:
        kernel_cache.store(target, cubin)
    except OSError as exc:
        _warn_once(
            f"hf_flashpatch: the kernel cache {target.parent} cannot be written ({_describe(exc)}); "
            f"kernels are compiled in a temp dir and again in every process"
        )
    kernel_cache.remove_stale(target.parent, kernel_cache.TEMP_RE)
    kernel_cache.remove_stale(target.parent, kernel_cache.LEGACY_TEMP_RE)
    return cubin, report


def _run_nvcc(build: KernelBuild, nvcc: str, verbose_ptxas: bool) -> tuple[bytes, str]:
    """Compile ``build`` in a private temp dir: ``(cubin, stderr)``, or KernelUnsupported saying why.
    Messages hold no temp paths, so a repeated failure repeats the same message (the API warns once)."""
    what = f"{build.source} {dict(build.defines)} ({build.arch})"
    try:
        workdir = tempfile.mkdtemp(prefix=kernel_cache.workdir_prefix())
    except OSError as exc:
        raise KernelUnsupported(f"no temp dir for nvcc to compile {what} in ({_describe(exc)})") from exc
    kernel_cache.remove_stale(Path(workdir).parent, kernel_cache.WORKDIR_RE)  # killed compiles' dirs
    try:
        out = os.path.join(workdir, "kernel.cubin")
        extra = ("-Xptxas", "-v") if verbose_ptxas else ()
        try:
            command = build.nvcc_command(nvcc, out, extra)
            proc = subprocess.run(command, capture_output=True, text=True, errors="replace")
        except OSError as exc:
            raise KernelUnsupported(f"nvcc at {nvcc} did not start for {what} ({_describe(exc)})") from exc
        if proc.returncode != 0:
            raise KernelUnsupported(f"nvcc failed for {what} (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        try:
            cubin = Path(out).read_bytes()
        except FileNotFoundError:
            raise KernelUnsupported(f"nvcc exited 0 but wrote no cubin for {what}") from None
        except OSError as exc:
            raise KernelUnsupported(f"reading nvcc's cubin for {what} failed ({_describe(exc)})") from exc
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    why = kernel_cache.check_cubin(cubin)
    if why is not None:
        raise KernelUnsupported(f"nvcc exited 0 but its output for {what} is no cubin: {why}")
    return cubin, proc.stderr


def _describe(exc: OSError) -> str:
    """``PermissionError: Permission denied``: the error without the path (temp paths would make every
    message unique, and the API warns once per message)."""
    return f"{type(exc).__name__}: {exc.strerror or exc}"


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


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


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # CUDA builds of torch


def _current_raw_stream(device_index: int) -> int:
    """The handle of torch's current stream (what inductor's launchers read; one C call, no Stream object)."""
    if _raw_stream is not None:
        return _raw_stream(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


class _InContext:
    """Make the device's primary context current in PyCUDA's (thread-local) view for a block."""

    def __init__(self, device_index: int):
        self.ctx = _primary_context(device_index)

    def __enter__(self):
        self.ctx.push()

    def __exit__(self, *exc):
        _pycuda().Context.pop()


class Kernel:
    """A loaded kernel entry point. Its argument letters come from its parameters in the CUDA source
    (:func:`~hf_flashpatch.kernels.sources.kernel_signature`; a ``__grid_constant__`` parameter struct
    counts as its fields, in order): ``P`` pointer (a tensor, or None for a null pointer), ``i`` int32,
    ``I`` uint32, ``q`` int64, ``f`` float32, ``T`` a tensor map's bytes. They make a :mod:`struct` format,
    so the argument buffer is packed in one call with the C ABI's natural alignment, which is how CUDA lays
    out kernel parameters and struct fields (a struct's padding included), from the offset the cubin gives
    the first parameter (:func:`~hf_flashpatch.kernels.cubin_symbols.first_parameter_offset`)."""

    def __init__(self, build: KernelBuild, entry: str, device_index: int):
        self.build, self.entry, self.device_index = build, entry, device_index
        self.set_signature(kernel_signature(build.source, entry))
        cubin, _ = compile_cubin(build)
        driver = _pycuda()
        with _InContext(device_index):
            try:
                self.module = driver.module_from_buffer(cubin)
            except driver.Error as exc:  # e.g. a driver older than this nvcc: the fallback still serves
                raise KernelUnsupported(f"the driver cannot load {build.source} ({build.arch}): {exc}") from exc
            self.function = self.module.get_function(entry)
        self.shared_bytes = shared_bytes_of(cubin, entry)
        self._leading = bytes(first_parameter_offset(cubin, entry))  # a 64-byte aligned struct starts past 0
        limit = getattr(torch.cuda.get_device_properties(device_index), "shared_memory_per_block_optin", None)
        if limit is not None and self.shared_bytes > limit:  # e.g. Ada's 99 KB: the tiles are sized for Hopper
            raise KernelUnsupported(f"{entry} ({build.source} {dict(build.defines)}) needs {self.shared_bytes} bytes "
                                    f"of shared memory, the device allows {limit}")  # fmt: skip
        self._max_shared_set = 48 * 1024
        self._context = self._driver = None  # torch's primary context and pycuda.driver, at the first launch
        self._resident_clusters: dict[tuple[int, int], int] = {}

    def resident_clusters(self, cluster: int, threads: int) -> int:
        """How many clusters of ``cluster`` CTAs of ``threads`` threads this kernel (compiled with that cluster
        size) runs at once on its device (:mod:`.clusters`; 0 where the driver cannot tell). Asked once, and not
        while a CUDA graph is being captured (loading a module then would end the capture): 0 for that call."""
        found = self._resident_clusters.get((cluster, threads))
        if found is None:
            if torch.cuda.is_current_stream_capturing():
                return 0
            cubin, _ = compile_cubin(self.build)
            with _InContext(self.device_index):
                found = resident_clusters(cubin, self.entry, cluster, threads, self.shared_bytes)
            self._resident_clusters[(cluster, threads)] = found
        return found

    def set_signature(self, signature: Signature) -> None:
        self._leading = b""
        self.arg_types = signature.letters
        self.packer = struct.Struct("@" + signature.format)
        self.pointer_positions = tuple(i for i, letter in enumerate(signature.letters) if letter == "P")

    def pack(self, args) -> bytes:
        """The kernel's parameter buffer: tensors as their data pointers, None as a null pointer."""
        if len(args) != len(self.arg_types):
            raise TypeError(f"{self.entry} takes {len(self.arg_types)} arguments, got {len(args)}")
        values = list(args)
        for i in self.pointer_positions:
            value = values[i]
            if value is None:
                values[i] = 0
            elif isinstance(value, torch.Tensor):
                values[i] = value.data_ptr()
        return self._leading + self.packer.pack(*values)

    def __call__(self, grid, block, *args, shared_bytes: int = 0, tensors=()):
        """Launch on torch's current stream. ``tensors``: every tensor the kernel touches (kept alive
        on the side stream when we fork)."""
        self.launch(grid, block, self.pack(args), shared_bytes=shared_bytes, tensors=tensors)

    def launch(self, grid, block, params: bytes, *, shared_bytes: int = 0, tensors=()):
        """Launch with a parameter buffer from :meth:`pack` (kernels with one parameter list share one)."""
        if self._context is None:
            self._context = _primary_context(self.device_index)
            self._driver = _pycuda()
        self._context.push()
        try:
            if shared_bytes > self._max_shared_set:
                self.function.set_attribute(
                    self._driver.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, int(shared_bytes)
                )
                self._max_shared_set = shared_bytes
            # The legacy default stream (handle 0) cannot be captured into a graph: launch on it directly.
            if _current_raw_stream(self.device_index) == 0:
                self.function._launch_kernel(grid, block, params, int(shared_bytes), None)
                return
            stream = torch.cuda.current_stream(self.device_index)
            side = _side_stream(self.device_index)
            external = torch.cuda.ExternalStream(side.handle, device=stream.device)
            external.wait_stream(stream)  # kernel starts after torch's queued work
            self.function._launch_kernel(grid, block, params, int(shared_bytes), side)
            stream.wait_stream(external)  # torch's later work waits for the kernel
            if not torch.cuda.is_current_stream_capturing():
                for t in tensors:
                    t.record_stream(external)
        finally:
            self._driver.Context.pop()


def shared_bytes_of(cubin: bytes, entry: str) -> int:
    """The dynamic shared memory ``entry`` needs, as its source states it (``<entry>_shared_bytes``, see
    :mod:`~hf_flashpatch.kernels.cubin_symbols`); 0 for a kernel without dynamic shared memory."""
    value = read_int32(cubin, f"{entry}_shared_bytes")
    return 0 if value is None else value


def _side_stream(device_index: int):
    stream = _side_streams.get(device_index)
    if stream is None:
        stream = _pycuda().Stream(flags=1)  # non-blocking w.r.t. the legacy default stream
        _side_streams[device_index] = stream
    return stream


_kernels: dict[tuple, Kernel] = {}
_failed: dict[tuple, str] = {}  # why a kernel could not be built, so that nvcc is not rerun every call


def unloaded_kernel(entry: str, source: str | None = None) -> Kernel:
    """A :class:`Kernel` that only packs arguments (no compile, no GPU): what CPU tests check launches with.
    ``source`` defaults to the ``cuda/`` file that defines ``entry``."""
    kernel = object.__new__(Kernel)
    kernel.build, kernel.entry, kernel.device_index = None, entry, None
    kernel.set_signature(kernel_signature(source or entry_source(entry), entry))
    return kernel


def get_kernel(build: KernelBuild, entry: str, device: torch.device) -> Kernel:
    """Compiled, loaded and prepared kernel for ``device`` (memoised per process, failures included:
    a kernel that raised KernelUnsupported raises the same message again without recompiling)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (build, entry, index)
    kernel = _kernels.get(key)
    if kernel is None:
        if key in _failed:
            raise KernelUnsupported(_failed[key])  # a fresh exception: re-raising one grows its traceback
        try:
            kernel = _kernels[key] = Kernel(build, entry, index)
        except KernelUnsupported as exc:
            _failed[key] = str(exc)
            raise
    return kernel


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    """The streaming multiprocessors of CUDA device ``device_index`` (what grids are sized by)."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def device_arch(device: torch.device) -> str:
    """The kernels' arch for CUDA ``device`` (asked once per device: every launch asks, and torch's query costs a
    few microseconds of host time each)."""
    index = device.index
    return _arch_of_device(torch.cuda.current_device() if index is None else index)


@functools.lru_cache(maxsize=None)
def _arch_of_device(device_index: int) -> str:
    return arch_for_capability(*torch.cuda.get_device_capability(device_index))
