"""The Hopper forward's tensor maps (:mod:`.tma`): which of K/V, the query rows and the output rows a launch of
``cuda/fwd_hopper_ws.cu`` moves by TMA boxes, and the maps it passes in ``FwdParams``. ``config`` is the launch's
:class:`~hf_flashpatch.kernels.forward.ForwardConfig`.

Layouts as the forward's: q and out ``(B, S, H, D)`` (varlen ``(T, H, D)``), k/v ``(B, S_k, H_kv, D)``; packed rows
are a query tile's GQA-packed rows (the ``group`` heads of a KV head fastest, then positions).
"""

import torch

from ..errors import KernelUnsupported
from . import tma


def packed_rows_map(wanted: bool, t: torch.Tensor, rows: int, group: int) -> tuple[bytes, int]:
    """``(map, box_heads)`` for boxes of ``rows`` packed rows of ``t`` (``group`` heads x ``rows // group``
    positions, the heads fastest), or ``(NO_DESCRIPTOR, 0)`` when not ``wanted``, when ``group`` does not divide
    ``rows``, for an empty ``t`` and for a layout the driver cannot map."""
    if not wanted or rows % group or t.numel() == 0:
        return tma.NO_DESCRIPTOR, 0
    try:
        return tma.descriptor(t, rows // group, box_heads=group), group
    except tma.TmaUnsupported:
        return tma.NO_DESCRIPTOR, 0


def query_map(config, q: torch.Tensor, group: int) -> tuple[bytes, int]:
    """``(q_tma, q_box_heads)``: the tensor map the Hopper body's producer loads each math warpgroup's 64 packed
    query rows with (``group`` heads x ``64 // group`` positions a box), and the heads a box holds, for a
    config with ``q_by_tma`` (``heuristics.HOPPER_SHAPES``). Other configs, a group that does not divide 64 (say
    3, 5 or 7) and a layout the driver cannot map get ``(NO_DESCRIPTOR, 0)``: the math warps then copy their rows
    themselves (``cuda/fwd_hopper_ws.cu``)."""
    return packed_rows_map(config.q_by_tma, q, 64, group)


def output_map(config, out: torch.Tensor, group: int, varlen: bool, q_box_heads: int) -> tuple[bytes, int]:
    """``(o_tma, o_box_heads)``: the tensor map each math warp of a config with ``tma_output`` stores its 16 packed
    output rows with (``group`` heads x ``16 // group`` positions a box), and the heads a box holds. Varlen problems
    (a box could cross into the next sequence), a group that does not divide 16 and other configs get
    ``(NO_DESCRIPTOR, 0)``: the threads then store their rows themselves. So does a config loading Q by the TMA
    whose launch has no query map (``q_box_heads`` 0, :func:`query_map`: a q the driver cannot map, a broadcast
    stride say): its math warps copy Q and store their rows, the pairing its GPU test checks. (The kernel's K-slot
    staging would also serve it: its wait has barriers of its own, ``cuda/fwd_hopper_ws.cu`` kKeySlotOutput.)"""
    wanted = config.tma_output and not varlen and (q_box_heads > 0 or not config.q_by_tma)
    return packed_rows_map(wanted, out, 16, group)


def kv_maps(config, k: torch.Tensor, v: torch.Tensor):
    """``(k, v, k_tma, v_tma)``: the tensor maps the Hopper body streams K and V with (empty for the mma.sync
    body). A layout the driver cannot map (a broadcast head, say) is read from contiguous copies."""
    if not config.wgmma or k.numel() == 0:  # no keys: the kernel issues no copy (and a map cannot be empty)
        return k, v, tma.NO_DESCRIPTOR, tma.NO_DESCRIPTOR
    rows = config.block_n // config.kv_cluster  # a CTA's share of each tile (all of it without the multicast)
    try:
        return k, v, tma.descriptor(k, rows), tma.descriptor(v, rows)
    except tma.TmaUnsupported:
        k, v = k.contiguous(), v.contiguous()
    try:
        return k, v, tma.descriptor(k, rows), tma.descriptor(v, rows)
    except tma.TmaUnsupported as exc:  # the torch fallback serves the call
        raise KernelUnsupported(f"the Hopper forward cannot map k/v for the TMA: {exc}") from exc
