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
from typing import NamedTuple

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


@functools.lru_cache(maxsize=None)
def _device_problem(device_index: int) -> str | None:
    major, minor = torch.cuda.get_device_capability(device_index)
    if major < 8:
        return f"compute capability {major}.{minor} < 8.0"
    return _toolchain_problem()


def kernels_unavailable_reason(tensor: torch.Tensor) -> str | None:
    """None when the CUDA kernels can serve a call on ``tensor``'s device, else the reason (asked once
    per device: every decode layer asks)."""
    if not tensor.is_cuda:
        return f"tensor is on {tensor.device}"
    return _device_problem(tensor.device.index)


def aligned(t: torch.Tensor, check_address: bool = True) -> torch.Tensor:
    """``t`` itself when the kernels' 16-byte loads (cp.async chunks, TMA rows) can read it in place: a contiguous
    last dim, rows 16-byte aligned; else a contiguous copy in a fresh allocation (``contiguous()`` would return a
    contiguous tensor at an unaligned address, say ``x[1:]``, as it is). ``check_address=False``: the strides only
    (a traced call, whose tensors have no address yet)."""
    strides = t.stride()
    if strides[-1] != 1 or (check_address and t.data_ptr() % 16):
        return t.clone(memory_format=torch.contiguous_format)
    for stride in strides[:-1]:  # a loop, not all() over a generator: every launch asks for each of its tensors
        if stride % 8:
            return t.clone(memory_format=torch.contiguous_format)
    return t


def fold_window(causal: bool, window_left: int, window_right: int) -> tuple[int, int]:
    """The kernels' window ``(left, right)``: -1 unbounded (any negative bound becomes -1); causal is
    bottom-right aligned, so it clamps ``right`` to at most 0. The one Python definition for every kernel
    (the reference's ``normalize_window`` is the same rule on the public ``(left, right)`` pair)."""
    left = -1 if window_left < 0 else int(window_left)
    right = -1 if window_right < 0 else int(window_right)
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right


LOG2E = 1.4426950408889634  # log2(e): the kernels take exp2 of scores pre-multiplied by it


class ScoreScales(NamedTuple):
    """``softmax_scale`` and ``softcap`` folded into the kernels' multipliers (see :func:`fold_scores`): the
    fields, in order, of ``ScoreScale`` in ``cuda/score_scale.cuh``, which every kernel family takes."""

    scale_log2: float  # scale * log2(e): an uncapped score's multiplier into the exp2 domain
    softcap_pre: float  # scale / softcap: a capped score's tanh argument per raw score; 0.0 without a cap
    softcap_log2: float  # softcap * log2(e): the capped score's multiplier into the exp2 domain; 0.0 without


def fold_scores(scale: float, softcap: float | None) -> ScoreScales:
    """The one Python definition of score scaling: a capped score is ``softcap * tanh(s * scale / softcap)``,
    an uncapped one ``s * scale``, and the kernels fold log2(e) into the outer factor. Any truthy ``softcap``
    is a cap (0, None = none); callers that map other values (the forward: scale 0, softcap <= 0) do so first."""
    if softcap:
        return ScoreScales(scale * LOG2E, scale / softcap, softcap * LOG2E)
    return ScoreScales(scale * LOG2E, 0.0, 0.0)


def define_op(name: str, impl, fake, tags: tuple = ()):
    """``torch.ops.hf_flashpatch.<name>``: the custom op with body ``impl`` and fake implementation ``fake``,
    defined once per process (a re-imported module reuses the op it defined before)."""
    try:
        return getattr(torch.ops.hf_flashpatch, name)
    except (AttributeError, RuntimeError):
        pass
    op = torch.library.custom_op(f"hf_flashpatch::{name}", mutates_args=(), tags=tags)(impl)
    op.register_fake(fake)
    return getattr(torch.ops.hf_flashpatch, name)


def call_op(op, impl, *args, eager_autograd: type[torch.autograd.Function] | None = None):
    """``op(*args)``, or in plain eager mode a path without the dispatcher: ``impl(*args)`` (the function behind
    the custom op ``op``, or the part of it that remains for inputs the caller has already checked) where nothing
    requires grad, and ``eager_autograd.apply(*args)`` (a :class:`torch.autograd.Function` with the op's own
    autograd, around ``impl``) where something does.

    The op is what ``torch.compile``, export, fake tensors, dispatch modes, functorch transforms and tensor
    subclasses need. In plain eager mode the dispatcher only adds its per-call host cost: about as much as packing
    and launching the kernel in inference (an eager decode loop pays it in every layer of every step), and in
    training, through the op's registered autograd, several times what SDPA's whole forward and backward cost on
    the host, which short sequences' steps pay in every layer."""
    if (
        torch.compiler.is_compiling()
        or torch.utils._python_dispatch._get_current_dispatch_mode() is not None
        or torch._C._functorch.peek_interpreter_stack() is not None
    ):
        return op(*args)
    grad = torch.is_grad_enabled()
    needs_grad = False
    for a in args:
        if isinstance(a, torch.Tensor):
            if type(a) is not torch.Tensor:
                return op(*args)
            needs_grad = needs_grad or (grad and a.requires_grad)
    if needs_grad:
        return op(*args) if eager_autograd is None else eager_autograd.apply(*args)
    return impl(*args)


_warned: set[tuple[str, str]] = set()


def warn_fallback_once(kernel: str, reason: str) -> None:
    """One warning per (kernel, reason) when a CUDA call takes the torch path inside an op."""
    if (kernel, reason) not in _warned:
        _warned.add((kernel, reason))
        warnings.warn(f"hf_flashpatch: {kernel} kernel not used ({reason}); taking the torch fallback", stacklevel=3)
