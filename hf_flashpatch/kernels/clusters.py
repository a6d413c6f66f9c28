"""How many thread-block clusters of a kernel the GPU runs at once (``cuOccupancyMaxActiveClusters``).

A kernel compiled with ``__cluster_dims__`` (the Hopper forward's K/V multicast, ``KV_CLUSTER`` in
``cuda/fwd_hopper_ws.cu``) launches its CTAs in clusters, each placed whole on one GPC. A persistent grid of such
a kernel must not ask for more clusters than fit at once: the rest would wait for the first to finish, a second
wave. How many fit depends on how the chip's SMs fall into GPCs, which only the driver knows (66 clusters of two
on the H200's 132 SMs, read on the device: ``results/2026-12-04_4b0fc16_fwd-kv-multicast``).

PyCUDA gives no handle of a loaded function, so this loads the cubin a second time through ``libcuda`` (in the
device's primary context, made current by the caller) and asks the driver; ``build.Kernel`` asks once.
A driver that cannot answer counts as 0 clusters: the caller then launches the kernel's plain build.
"""

from __future__ import annotations

import ctypes

_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # CUfunction_attribute


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [
        ("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
        ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
        ("shared_bytes", ctypes.c_uint), ("stream", ctypes.c_void_p),
        ("attributes", ctypes.c_void_p), ("num_attributes", ctypes.c_uint),
    ]  # fmt: skip


def resident_clusters(cubin: bytes, entry: str, cluster: int, threads: int, shared_bytes: int) -> int:
    """The clusters of ``cluster`` CTAs (``threads`` threads and ``shared_bytes`` of dynamic shared memory each)
    of ``entry`` in ``cubin`` that run at once on the device of the current context; 0 where the driver cannot
    tell. The caller makes the device's primary context current and keeps the answer (``build.Kernel``)."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        module, function = ctypes.c_void_p(), ctypes.c_void_p()
        if libcuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(cubin)) != 0:
            return 0
        try:
            if libcuda.cuModuleGetFunction(ctypes.byref(function), module, entry.encode()) != 0:
                return 0
            if libcuda.cuFuncSetAttribute(function, _MAX_DYNAMIC_SHARED_SIZE_BYTES, ctypes.c_int(shared_bytes)) != 0:
                return 0
            config = _LaunchConfig(cluster, 1, 1, threads, 1, 1, shared_bytes, None, None, 0)
            count = ctypes.c_int(0)
            if libcuda.cuOccupancyMaxActiveClusters(ctypes.byref(count), function, ctypes.byref(config)) != 0:
                return 0
            return max(0, count.value)
        finally:
            libcuda.cuModuleUnload(module)
    except (OSError, AttributeError):  # no libcuda, or a driver without the call
        return 0
