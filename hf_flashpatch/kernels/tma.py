"""Tensor maps for the TMA (``cuda/tma.cuh``): encoded on the host by the CUDA driver, passed by value
inside a kernel's parameter struct (letter ``T`` in :mod:`~hf_flashpatch.kernels.sources`).

Layout: a Q, K, V, dO or output tensor ``(B, S, H, D)``, or varlen ``(T, H, D)`` (a batch of one), whose last dim
is contiguous (the forward stores its output by boxes of a batched map only: a box stops at the map's end, not at a
varlen sequence's). Its map is rank 4 over (columns, heads, rows, batch), the order of the kernel's box coordinates,
and a box is ``BOX_COLUMNS`` columns (128 bytes) x ``box_heads`` heads x ``box_rows`` rows x 1 batch with the
128-byte swizzle: one SW128 sub-tile of the Hopper kernels, its rows in (row, head) order, the head fastest
(the forward's GQA-packed query rows). Rows past ``S`` (or ``T``) come back as zeros.

Encoding calls ``cuTensorMapEncodeTiled`` in ``libcuda`` (no context needed) and takes a few
microseconds; maps are memoised by (address, dtype, shape, strides, box), so a training loop that reuses
its buffers encodes once. The driver refuses some layouts (a stride that is not a multiple of 16 bytes, a
broadcast stride of 0): :func:`descriptor` raises :class:`TmaUnsupported` naming what it got, and the
forward then reads contiguous copies (``kernels/forward.py``). The backward also maps its fp32 workspaces: its row
statistics (:func:`stats_descriptor`) and its dQ accumulator (:func:`reduce_descriptor`).
"""

from __future__ import annotations

import ctypes
import functools

import torch

DESCRIPTOR_BYTES = 128
NO_DESCRIPTOR = bytes(DESCRIPTOR_BYTES)  # the field's value for a kernel that does not read it
BOX_COLUMNS = 64  # 128 bytes of 16-bit elements: the 128-byte swizzle's row

# CUtensorMapDataType, CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill
_DATA_TYPES = {torch.float16: 6, torch.bfloat16: 9}
_FLOAT32 = 7
_INTERLEAVE_NONE, _SWIZZLE_NONE, _SWIZZLE_128B, _L2_PROMOTION_256B, _OOB_FILL_ZEROS = 0, 0, 3, 3, 0
_CACHE_LIMIT = 4096


class TmaUnsupported(ValueError):
    """The driver cannot describe this tensor with a tensor map."""


def map_geometry(t: torch.Tensor, box_rows: int,
                 box_heads: int = 1) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """``(dims, byte strides of dims 1..3, box)`` of the rank-4 (columns, heads, rows, batch) map of ``t``:
    ``(B, S, H, D)`` or varlen ``(T, H, D)``. A dim of size 1 gets the stride a contiguous tensor would have
    (its stride is never used, and the driver wants every stride a multiple of 16 bytes)."""
    if t.dim() == 3:
        t = t.unsqueeze(0)  # (1, T, H, D): varlen as a batch of one
    if t.dim() != 4 or t.stride(-1) != 1:
        raise TmaUnsupported(f"a tensor map takes a (B, S, H, D) or (T, H, D) tensor with contiguous columns, "
                             f"got shape {tuple(t.shape)} strides {t.stride()}")  # fmt: skip
    batch, rows, heads, columns = t.shape
    elem = t.element_size()
    strides = []
    for size, stride, dense in ((heads, t.stride(2), columns), (rows, t.stride(1), heads * columns),
                                (batch, t.stride(0), rows * heads * columns)):  # fmt: skip
        strides.append((dense if size == 1 else stride) * elem)
    return (columns, heads, rows, batch), tuple(strides), (BOX_COLUMNS, box_heads, box_rows, 1)


@functools.lru_cache(maxsize=1)
def _encode_tiled():
    function = ctypes.CDLL("libcuda.so.1").cuTensorMapEncodeTiled
    u64p, u32p = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
    function.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                         ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]  # fmt: skip
    function.restype = ctypes.c_int
    return function


_maps: dict[tuple, bytes] = {}


def descriptor(t: torch.Tensor, box_rows: int, box_heads: int = 1) -> bytes:
    """The encoded tensor map (``DESCRIPTOR_BYTES``) of ``t`` for boxes of ``box_heads`` heads x ``box_rows``
    rows (module docstring). Looked up by the tensor's own (address, dtype, shape, strides) and the box before
    anything is computed: every launch asks for its maps."""
    key = (t.data_ptr(), t.dtype, t.shape, t.stride(), box_rows, box_heads)
    found = _described.get(key)
    if found is not None:
        return found
    if t.dtype not in _DATA_TYPES or t.data_ptr() % 16:
        raise TmaUnsupported(f"a tensor map takes a 16-byte aligned float16/bfloat16 tensor, got {t.dtype} at "
                             f"address {t.data_ptr():#x}")  # fmt: skip
    dims, strides, box = map_geometry(t, box_rows, box_heads)
    encoded = _encoded(t, _DATA_TYPES[t.dtype], dims, strides, box)
    if len(_described) >= _CACHE_LIMIT:
        _described.clear()
    _described[key] = encoded
    return encoded


_described: dict[tuple, bytes] = {}  # descriptor's maps by tensor layout and box (the driver's by geometry: _maps)


REDUCE_BOX = (32, 64)  # (columns, rows) of one dQ reduce box: 128 bytes of fp32 (the swizzle's row) x 64 queries


def reduce_descriptor(dq_accum: torch.Tensor) -> bytes:
    """The tensor map of the backward's fp32 dQ workspace ``(batch, heads, rows, head_dim)``, contiguous, for
    the TMA's reduce-add of ``REDUCE_BOX`` boxes (rank 4: columns, rows, heads, batch; 128-byte swizzle)."""
    batch, heads, rows, columns = dq_accum.shape
    if dq_accum.dtype != torch.float32 or not dq_accum.is_contiguous() or dq_accum.data_ptr() % 16:
        raise TmaUnsupported(f"the dQ workspace map takes a contiguous, 16-byte aligned float32 tensor, got "
                             f"{dq_accum.dtype} shape {tuple(dq_accum.shape)} strides {dq_accum.stride()}")  # fmt: skip
    strides = (columns * 4, rows * columns * 4, heads * rows * columns * 4)
    return _encoded(dq_accum, _FLOAT32, (columns, rows, heads, batch), strides, (*REDUCE_BOX, 1, 1))


STATS_ALIGN_ROWS = 4  # a copy starts 16-byte aligned in its innermost dim: 4 fp32 rows


def stats_descriptor(stats: torch.Tensor, step_rows: int) -> bytes:
    """The tensor map of the backward's row statistics ``(2, batch, heads, rows)``, fp32 and contiguous (lse2,
    then D), for the rows of a step of ``step_rows`` in one box of both (rank 4: rows, heads, batch, the two; no
    swizzle). The rows are the innermost dim, where a copy must start 16-byte aligned: a box starts at the step's
    first row rounded down to a multiple of ``STATS_ALIGN_ROWS`` and has that many rows more
    (``cuda/bwd_hopper_tiles.cuh``, ``kHStatsRows``); it lands as those rows' lse2 followed by their D."""
    two, batch, heads, rows = stats.shape
    if two != 2 or stats.dtype != torch.float32 or not stats.is_contiguous() or stats.data_ptr() % 16:
        raise TmaUnsupported(f"the row statistics map takes a contiguous, 16-byte aligned (2, batch, heads, rows) "
                             f"float32 tensor, got {stats.dtype} shape {tuple(stats.shape)} strides "
                             f"{stats.stride()}")  # fmt: skip
    strides = (rows * 4, heads * rows * 4, batch * heads * rows * 4)
    box = (step_rows + STATS_ALIGN_ROWS, 1, 1, 2)
    return _encoded(stats, _FLOAT32, (rows, heads, batch, 2), strides, box, _SWIZZLE_NONE)


def _encoded(t: torch.Tensor, data_type: int, dims, strides, box, swizzle: int = _SWIZZLE_128B) -> bytes:
    """The rank-4 map of ``t`` (memoised by address, type, dims, strides, box and swizzle)."""
    key = (t.data_ptr(), data_type, tuple(dims), tuple(strides), tuple(box), swizzle)
    found = _maps.get(key)
    if found is not None:
        return found
    if any(s % 16 or s == 0 for s in strides):
        raise TmaUnsupported(f"a tensor map needs strides of non-zero multiples of 16 bytes, got shape "
                             f"{tuple(t.shape)} strides {t.stride()} ({t.dtype})")  # fmt: skip
    storage = ctypes.create_string_buffer(DESCRIPTOR_BYTES + 64)
    address = (ctypes.addressof(storage) + 63) // 64 * 64  # the driver writes a 64-byte aligned map
    code = _encode_tiled()(
        address, data_type, 4, t.data_ptr(), (ctypes.c_uint64 * 4)(*dims),
        (ctypes.c_uint64 * 3)(*strides), (ctypes.c_uint32 * 4)(*box), (ctypes.c_uint32 * 4)(1, 1, 1, 1),
        _INTERLEAVE_NONE, swizzle, _L2_PROMOTION_256B, _OOB_FILL_ZEROS,
    )  # fmt: skip
    if code != 0:
        raise TmaUnsupported(f"cuTensorMapEncodeTiled refused shape {tuple(t.shape)} strides {t.stride()} "
                             f"({t.dtype}, box {box}): CUresult {code}")  # fmt: skip
    encoded = ctypes.string_at(address, DESCRIPTOR_BYTES)
    if len(_maps) >= _CACHE_LIMIT:
        _maps.clear()
    _maps[key] = encoded
    return encoded
