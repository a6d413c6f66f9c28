"""CUDA fast paths: PyCUDA-compiled kernels from ``cuda/``. Nothing here imports the reference.

Modules (each exposes plain functions on torch tensors and raises
:class:`hf_flashpatch.errors.KernelUnsupported` for what it cannot serve):

- ``build``:      nvcc + on-disk cubin cache + PyCUDA load/launch on torch's stream;
- ``heuristics``: the decision room: which body, tiles and split-KV factor serve a call (shipped only);
- ``forward``:    FlashAttention forward (batched and varlen), a differentiable custom op;
- ``backward``:   the fused backward behind that op's autograd;
- ``decode``:     split-KV decode over a contiguous, paged (block table) or slot-indexed KV cache.
"""

from __future__ import annotations

import functools
import warnings

import torch


@functools.lru_cache(maxsize=None)
def _toolchain_problem() -> str | None:
    """Why the kernels cannot run on this machine at all, or None."""
    from .build import find_nvcc

    try:
        import pycuda.driver  # noqa: F401  (needs libcuda.so.1)
    except Exception as exc:
        return f"pycuda is not importable ({type(exc).__name__}: {exc})"
    if find_nvcc() is None:
        return "nvcc was not found (set CUDA_HOME or put nvcc on PATH)"
    return None


def kernels_unavailable_reason(tensor: torch.Tensor) -> str | None:
    """None when the CUDA kernels can serve a call on ``tensor``'s device, else the reason."""
    if not tensor.is_cuda:
        return f"tensor is on {tensor.device}"
    major, minor = torch.cuda.get_device_capability(tensor.device)
    if major < 8:
        return f"compute capability {major}.{minor} < 8.0"
    return _toolchain_problem()


def fold_window(causal: bool, window_left: int, window_right: int) -> tuple[int, int]:
    """The kernels' window ``(left, right)``: -1 unbounded (any negative bound becomes -1); causal is
    bottom-right aligned, so it clamps ``right`` to at most 0. The one Python definition for every kernel
    (the reference's ``normalize_window`` is the same rule on the public ``(left, right)`` pair)."""
    left = -1 if window_left < 0 else int(window_left)
    right = -1 if window_right < 0 else int(window_right)
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right


_warned: set[tuple[str, str]] = set()


def warn_fallback_once(kernel: str, reason: str) -> None:
    """One warning per (kernel, reason) when a CUDA call takes the torch path inside an op."""
    if (kernel, reason) not in _warned:
        _warned.add((kernel, reason))
        warnings.warn(f"hf_flashpatch: {kernel} kernel not used ({reason}); taking the torch fallback", stacklevel=3)
