"""A stand-in for :class:`hf_flashpatch.kernels.build.Kernel` in CPU tests (no compile, no GPU).

Every launch's arguments are packed as the real launch packs them, against the entry point's parameter
list in ``cuda/`` (a wrong count, or a float where an int goes, raises), and recorded unpacked:
``calls`` gets ``(entry, grid, args)`` per launch.
"""

from __future__ import annotations

from hf_flashpatch.kernels.build import unloaded_kernel


class RecordingKernel:
    def __init__(self, entry: str, calls: list, shared_bytes: int = 0):
        self.entry, self.calls, self._real = entry, calls, unloaded_kernel(entry)
        self.shared_bytes = shared_bytes  # a loaded Kernel reads it from its cubin

    def pack(self, args) -> tuple:
        self._real.pack(args)  # raises where the real launch would
        return tuple(args)  # kept unpacked, so tests can read the values as the launcher computed them

    def resident_clusters(self, cluster: int, threads: int) -> int:
        return 132 // cluster  # an H100 / H200 holds a full grid of clusters (build.Kernel.resident_clusters)

    def launch(self, grid, block, params, **kwargs) -> None:
        self.calls.append((self.entry, grid, params))

    def __call__(self, grid, block, *args, **kwargs) -> None:
        self.launch(grid, block, self.pack(args), **kwargs)
