"""FlashAttention-2 backward (``cuda/bwd.cu``) as the custom op ``hf_flashpatch::attention_backward``,
and the autograd of ``hf_flashpatch::attention_forward`` built on it.

Layout: q/out/dout ``(B, S_q, H, D)``, k/v ``(B, S_k, H_kv, D)``, lse ``(B, H, S_q)`` fp32 natural log;
varlen: q ``(T_q, H, D)``, k/v ``(T_k, H_kv, D)``, lse ``(H, T_q)``, ``cu_seqlens`` int32 ``(N + 1,)``.
Any strides with a contiguous last dim (16-byte aligned rows; anything else is copied first).
v/out/dout may have a head dim of their own, ``D_v`` (multi-head latent attention): the Hopper body takes 192/128
itself (:func:`.heuristics.native_backward_value_head_dim`); other pairs, softcap, ``deterministic=True`` and other
GPUs run on exactly zero-padded inputs (:func:`.value_head_dim.padded_gradients`), as does a head dim up to 256 that no
build takes (16, 48, 80, 160, ...).
Returns dq in q's shape and dtype, dk/dv in k/v's (contiguous). Query head ``h`` reads KV head
``h // (H // H_kv)``; dk/dv sum over the group inside the kernel (no ``repeat_kv`` copy).

Launch sequence (one stream):

1. ``bwd_preprocess``: ``D = rowsum(dO * O) - dLSE`` and ``lse * log2(e)`` into padded workspaces; with
   ``deterministic=False`` it also zeroes the fp32 dQ workspace (no separate memset).
2. ``deterministic=False``: ``bwd_dkdv_dq_atomic`` (dK, dV in registers per K/V tile; dQ added to an
   fp32 workspace with atomics), then ``bwd_convert_dq`` (scale + cast). One pass over the 5 GEMMs.
   ``deterministic=True``: ``bwd_dkdv`` (no dQ) then ``bwd_dq`` (one block per query tile, dQ in
   registers, no atomics): bit-identical results run to run, at the price of recomputing ``Q K^T`` and
   ``dO V^T`` (7 GEMMs instead of 5, so slower: the atomic path is the default; ``notes/backward.md``).

Bodies (chosen by :meth:`BackwardConfig.choose`): ``wgmma`` (``cuda/bwd_hopper.cuh``: every GEMM on
Hopper's warpgroup MMA; sm_90a, d64/d128 and 192/128), ``tiled`` (``cuda/bwd_tiled.cuh``: FA2's 2-D warp tiling of
all five GEMMs; d64/d128 on other GPUs) and ``default`` (the per-warp 16-key body of ``bwd_default.cuh``:
the other head dims, and ``deterministic=True``, whose two-kernel path only it has). Benchmarks time
another configuration by passing it to :func:`_kernel_backward` explicitly.

Fallback: calls the kernels cannot serve (CPU, fp32, head dims other than 32/64/96/128/256, no
pycuda/nvcc, compute capability < 8.0, less shared memory than the tiles need) raise :class:`KernelUnsupported` from
:func:`attention_backward`; the custom op and the autograd take :func:`torch_backward` instead
(warning once): it recomputes ``P = exp(S - lse)`` in fp32 one query chunk at a time (memory
``O(chunk * S_k)``) and applies the same gradient formulas.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch.autograd.function import once_differentiable

from ..errors import KernelUnsupported
from . import (LOG2E, aligned, call_op, define_op, fold_scores, fold_window,  # noqa: F401 - LOG2E re-exported
               kernels_unavailable_reason, tma, warn_fallback_once)
from .backward_torch import torch_backward
from .build import KernelBuild, device_arch, get_kernel, sm_count
from .heuristics import BACKWARD_HEAD_DIMS as SUPPORTED_HEAD_DIMS
from .heuristics import (HOPPER_BACKWARD_VALUE_HEAD_DIMS, backward_tiles, native_backward_value_head_dim,
                         padding_head_dims)
from .value_head_dim import padded_gradients, padded_head_dim

_ROW_PAD = 128  # workspace rows are padded so every query tile read stays in bounds


@dataclass(frozen=True)
class BackwardConfig:
    """Tile shape of one ``cuda/bwd.cu`` build; the frozen instance keys the compile cache.

    ``bwd_dkdv``: ``num_warps`` warps; ``num_warps / d_split`` groups of 16 keys (``block_n`` keys per
    block); each warp owns ``head_dim / d_split`` columns of dK/dV; ``block_m`` query rows per step.
    ``bwd_dq``: ``dq_warps * 16`` query rows per block, ``dq_block_n`` keys per step.
    """

    head_dim: int
    bf16: bool
    softcap: bool
    block_m: int = 64
    num_warps: int = 8
    d_split: int = 1
    dq_block_n: int = 64
    dq_warps: int = 8
    ss_unroll: int = 2
    dq_chunk: int = 32
    dq_warp_rows: int = 16  # query rows per warp in bwd_dkdv's dQ product; 32 halves its K re-reads
    arch: str = "sm_90a"
    # "default": the per-warp 16-key body of bwd_dkdv_dq_atomic; "tiled": cuda/bwd_tiled.cuh (all five
    # GEMMs tiled 2-D over the 8 warps, P^T/dS^T through shared memory; d64/d128, non-deterministic only);
    # "wgmma": cuda/bwd_hopper.cuh (two warpgroups, all five GEMMs on wgmma; sm_90a, d64/d128)
    body: str = "default"
    tiled_unroll: int = 2  # unroll of the tiled body's shared-memory GEMM k loops
    tiled_block_m: int = 64  # query rows per step of the tiled body (128: d64 only, shared memory)
    wgmma_block_m: int = 64  # wgmma body: queries per step (128 at d64, dQ split by query rows; 64 at d128)
    head_dim_v: Optional[int] = None  # v's head dim where the build takes its own (wgmma body, 192/128); None: head_dim

    @property
    def block_n(self) -> int:
        return (self.num_warps // self.d_split) * 16  # the tiled body's 128 keys too (8 warps, d_split 1)

    @property
    def threads(self) -> int:
        return self.num_warps * 32

    @property
    def dq_block_m(self) -> int:
        return self.dq_warps * 16

    @staticmethod
    def choose(head_dim: int, dtype: torch.dtype, softcap: bool, arch: str = "sm_90a",
               deterministic: bool = False, head_dim_v: Optional[int] = None) -> "BackwardConfig":  # fmt: skip
        """The config for a call: body and tiles from :func:`.heuristics.backward_tiles` (``head_dim_v``: v's head
        dim, for a pair :func:`.heuristics.native_backward_value_head_dim` takes); raises
        :class:`KernelUnsupported` for head dims and dtypes the kernels do not serve."""
        if head_dim not in SUPPORTED_HEAD_DIMS:
            raise KernelUnsupported(f"backward kernel head_dim must be one of {SUPPORTED_HEAD_DIMS}, got {head_dim}")
        if dtype not in (torch.float16, torch.bfloat16):
            raise KernelUnsupported(f"backward kernel needs float16 or bfloat16, got {dtype}")
        tiles = backward_tiles(head_dim, bool(softcap), arch, deterministic, head_dim_v=head_dim_v)
        return BackwardConfig(head_dim, dtype == torch.bfloat16, bool(softcap), arch=arch, **tiles)

    @functools.lru_cache(maxsize=None)  # made once per config: every launch asks (configs are few)
    def build(self) -> KernelBuild:
        """The compile-cache key of this config."""
        defines = (
            ("HEAD_DIM", self.head_dim), ("ELEM_BF16", int(self.bf16)), ("HAS_SOFTCAP", int(self.softcap)),
            ("BLOCK_M", self.block_m), ("NUM_WARPS", self.num_warps), ("D_SPLIT", self.d_split),
            ("DQ_BLOCK_N", self.dq_block_n), ("DQ_WARPS", self.dq_warps), ("SS_UNROLL", self.ss_unroll),
            ("DQ_CHUNK", self.dq_chunk), ("DQ_WARP_ROWS", self.dq_warp_rows),
        )  # fmt: skip
        if self.body == "tiled":  # appended only here, so the default builds keep their cache keys
            defines += (("BWD_TILED", 1), ("TILED_BLOCK_M", self.tiled_block_m), ("TILED_UNROLL", self.tiled_unroll))
        if self.body == "wgmma":
            if self.arch != "sm_90a":
                raise KernelUnsupported(f"the wgmma backward body needs sm_90a, got {self.arch}")
            defines += (("BWD_WGMMA", 1), ("BWD_WGMMA_BLOCK_M", self.wgmma_block_m))
            if self.head_dim_v is not None:
                defines += (("HEAD_DIM_V", self.head_dim_v),)
        return KernelBuild("bwd.cu", tuple((n, str(v)) for n, v in defines), self.arch)


def all_builds(arch: str = "sm_90a") -> list[KernelBuild]:
    """Every build :func:`attention_backward` can launch on ``arch`` (for the CI compile check)."""
    builds = [
        BackwardConfig.choose(d, dtype, softcap, arch, deterministic).build()
        for d in SUPPORTED_HEAD_DIMS
        for dtype in (torch.bfloat16, torch.float16)
        for softcap in (False, True)
        for deterministic in (False, True)
    ]
    builds += [
        BackwardConfig.choose(d, dtype, False, arch, head_dim_v=d_v).build()
        for d, d_v in HOPPER_BACKWARD_VALUE_HEAD_DIMS
        if native_backward_value_head_dim(d, d_v, arch)
        for dtype in (torch.bfloat16, torch.float16)
    ]
    return list(dict.fromkeys(builds))


# ------------------------------------------------------------------------------------ launching



def check_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softcap: float,
                    deterministic: bool = False) -> BackwardConfig:  # fmt: skip
    """The config that serves this call, or :class:`KernelUnsupported` saying why none does. Where v's head dim
    differs from q's, the config takes the pair (:func:`.heuristics.native_backward_value_head_dim`: ``head_dim_v``
    set), else it is the one of the padded head dim (:func:`.value_head_dim.padded_head_dim`), which is q's own
    where a build takes it."""
    reason = kernels_unavailable_reason(q)
    if reason is not None:
        raise KernelUnsupported(reason)
    if k.shape[-1] != q.shape[-1]:
        raise KernelUnsupported(f"backward kernel needs k's head_dim == q's, got {tuple(k.shape)} and {tuple(q.shape)}")
    head_dim, head_dim_v = q.shape[-1], v.shape[-1]
    arch = device_arch(q.device)
    if head_dim_v != head_dim and native_backward_value_head_dim(head_dim, head_dim_v, arch, bool(softcap),
                                                                 bool(deterministic)):  # fmt: skip
        return BackwardConfig.choose(head_dim, q.dtype, bool(softcap), arch, bool(deterministic), head_dim_v)
    # head_dim itself where the padding takes it as it is (heuristics.padding_head_dims: 96 is padded on Hopper)
    padded = padded_head_dim(head_dim, head_dim_v, padding_head_dims(SUPPORTED_HEAD_DIMS, arch, bool(deterministic)))
    return BackwardConfig.choose(padded, q.dtype, bool(softcap), arch, bool(deterministic))



HEAVY_FIRST_MAX_WAVES = 8  # dK/dV grids of at most this many waves (one block per SM) run heaviest key block first


def dkdv_grid(kv_heads: int, batch: int, key_blocks: int, sms: int, choice: bool = True) -> tuple[tuple, int]:
    """Grid and ``heavy_first`` flag of the dK/dV kernels (cuda/bwd_common.cuh, ``dkdv_block``). Up to
    ``HEAVY_FIRST_MAX_WAVES`` waves on ``sms`` SMs, or always without ``choice`` (the mma.sync bodies): (kv heads,
    key blocks, batch), block n of every KV head of a sequence before block n + 1, so the long (causal) blocks do
    not start in the last wave. More waves: (key blocks, kv heads, batch), one head's blocks together, which share
    its tiles in L2."""
    if key_blocks > 65535 or batch > 65535:
        raise KernelUnsupported(f"grid limit: at most 65535 key blocks and 65535 sequences, got {key_blocks} key "
                                f"blocks and {batch} sequences")  # fmt: skip
    if not choice or kv_heads * batch * key_blocks <= HEAVY_FIRST_MAX_WAVES * sms:
        return (kv_heads, key_blocks, batch), 1
    return (key_blocks, kv_heads, batch), 0


def _kernel_backward(cfg, dout, q, k, v, out, lse, dlse, cu_q, cu_k, max_q, max_k, scale, left, right, softcap,
                     deterministic):  # fmt: skip
    varlen = cu_q is not None
    dout, q, k, v, out = (aligned(t) for t in (dout, q, k, v, out))
    lse = lse.float().contiguous()
    dlse = dlse.float().contiguous() if dlse is not None else None
    heads, kv_heads, head_dim = q.shape[-2], k.shape[-2], q.shape[-1]
    if varlen:
        batch, batch_ws, rows_valid = cu_q.numel() - 1, 1, q.shape[0]
        seqlen_q, seqlen_k = int(max_q), int(max_k)
        cu_q, cu_k = (c.to(device=q.device, dtype=torch.int32).contiguous() for c in (cu_q, cu_k))

        def strides(t):  # (T, H, D): no batch stride, sequence b starts at cu_seqlens[b]
            stride = t.stride()
            return 0, stride[0], stride[1]
    else:
        batch, seqlen_q = q.shape[0], q.shape[1]
        seqlen_k, batch_ws, rows_valid = k.shape[1], batch, seqlen_q

        def strides(t):  # (B, S, H, D)
            return t.stride()[:3]

    rows_pad = (rows_valid + _ROW_PAD - 1) // _ROW_PAD * _ROW_PAD + _ROW_PAD
    device = q.device
    if v.shape[-1] != (cfg.head_dim_v or head_dim) or (deterministic and cfg.head_dim_v is not None):
        raise KernelUnsupported(f"backward config {cfg} does not take q {tuple(q.shape)} with v {tuple(v.shape)} "
                                f"(deterministic {deterministic})")  # fmt: skip
    if deterministic and cfg.body != "default":  # an explicit cfg of another body: it has no dQ-free twin
        cfg = BackwardConfig.choose(head_dim, q.dtype, cfg.softcap, cfg.arch, deterministic=True)
    build = cfg.build()
    entries = ("bwd_dkdv", "bwd_dq") if deterministic else ("bwd_dkdv_dq_atomic", "bwd_convert_dq")
    pre, dkdv, last = (get_kernel(build, entry, device) for entry in ("bwd_preprocess", *entries))
    # One fp32 allocation: the row statistics (2, B, H, rows_pad), one map covering both, then the dQ workspace
    # (B, H, rows_pad, D) the dK/dV kernel adds into, which bwd_preprocess zeroes (the deterministic pair has none).
    # rows_pad is a multiple of 128, so the workspace starts 1 KB aligned.
    stats_size = 2 * batch_ws * heads * rows_pad
    dq_size = 0 if deterministic else batch_ws * heads * rows_pad * head_dim
    workspace = torch.empty(stats_size + dq_size, dtype=torch.float32, device=device)
    stats = workspace[:stats_size].view(2, batch_ws, heads, rows_pad)
    lse2, dvec = stats[0], stats[1]  # lse * log2(e); rowsum(dO * O) - dLSE
    dq_accum = None if deterministic else workspace[stats_size:].view(batch_ws, heads, rows_pad, head_dim)
    pre((rows_pad // 32, heads, batch_ws), (128, 1, 1), out, dout, lse, dlse, lse2, dvec, dq_accum,
        cu_q if varlen else None, batch, *strides(out), *strides(dout), heads, rows_valid, rows_pad,
        tensors=(out, dout, lse, lse2, dvec) + ((dlse,) if dlse is not None else ()) + ((cu_q,) if varlen else ())
        + ((dq_accum,) if dq_accum is not None else ()))  # fmt: skip

    # varlen: tokens past cu_seqlens[-1] belong to no sequence; the kernels skip them, so start from 0
    alloc = torch.zeros if varlen else torch.empty
    dq = alloc(q.shape, dtype=q.dtype, device=device)
    dk = alloc(k.shape, dtype=k.dtype, device=device)
    dv = alloc(v.shape, dtype=v.dtype, device=device)
    scales = fold_scores(scale, softcap)
    scalars = (seqlen_q, seqlen_k, heads, kv_heads, rows_pad, scale, scales.scale_log2,
               scales.softcap_pre, scales.softcap_log2, left, right,
               q.shape[0], k.shape[0])  # fmt: skip  (varlen: total rows, the bound of every cu_seqlens read)
    inputs = (q, k, v, dout, lse2, dvec)
    all_strides = (*strides(q), *strides(k), *strides(v), *strides(dout))
    cu = (cu_q, cu_k) if varlen else (None, None)
    cu_tensors = (cu_q, cu_k) if varlen else ()
    key_blocks = (seqlen_k + cfg.block_n - 1) // cfg.block_n
    grid_kv, heavy_first = dkdv_grid(kv_heads, batch, key_blocks, sm_count(device.index), choice=cfg.body == "wgmma")
    if deterministic:
        dkdv(grid_kv, (cfg.threads, 1, 1), *inputs, None, dk, dv, *cu, *all_strides, *scalars, heavy_first,
             shared_bytes=dkdv.shared_bytes, tensors=inputs + (dk, dv) + cu_tensors)  # fmt: skip
        grid_q = ((seqlen_q + cfg.dq_block_m - 1) // cfg.dq_block_m, heads, batch)
        last(grid_q, (cfg.dq_warps * 32, 1, 1), *inputs, dq, *cu, *all_strides, *scalars,
             shared_bytes=last.shared_bytes, tensors=inputs + (dq,) + cu_tensors)  # fmt: skip
    else:
        maps = _tensor_maps(cfg, dq_accum, q, dout, stats)
        dkdv(grid_kv, (cfg.threads, 1, 1), *maps, *inputs, dq_accum, dk, dv, *cu, *all_strides, *scalars,
             heavy_first, shared_bytes=dkdv.shared_bytes, tensors=inputs + (dq_accum, dk, dv) + cu_tensors)  # fmt: skip
        blocks = (rows_valid * head_dim // 8 + 255) // 256
        if blocks > 0:  # bwd_convert_dq: scale and cast the fp32 dQ workspace
            last((blocks, heads, batch_ws), (256, 1, 1), dq_accum, dq, heads, rows_valid, rows_pad, scale,
                 tensors=(dq_accum, dq))  # fmt: skip
    return dq, dk, dv


def _tensor_maps(cfg: BackwardConfig, dq_accum: torch.Tensor, q: torch.Tensor, dout: torch.Tensor,
                 stats: torch.Tensor) -> tuple[bytes, bytes, bytes, bytes]:  # fmt: skip
    """``(dq_map, q_map, do_map, stats_map)``, the TMA maps of the wgmma body (``cuda/bwd_hopper.cuh``): its loads of
    q, dout and the ``(2, B, H, rows_pad)`` lse2 / D workspace in boxes of a step's ``wgmma_block_m`` rows, and, with
    one head dim (d64, d128; ``kHDqTma``), its reduce-add of dQ into ``dq_accum``. The other bodies, and a call with
    no query rows (no step loads anything), get empty maps. A map the driver refuses raises KernelUnsupported: the
    torch backward serves the call."""
    if cfg.body != "wgmma" or q.numel() == 0:
        return (tma.NO_DESCRIPTOR,) * 4
    rows = cfg.wgmma_block_m
    try:
        dq_map = tma.reduce_descriptor(dq_accum) if cfg.head_dim_v is None else tma.NO_DESCRIPTOR
        return dq_map, tma.descriptor(q, rows), tma.descriptor(dout, rows), tma.stats_descriptor(stats, rows)
    except tma.TmaUnsupported as exc:
        raise KernelUnsupported(f"the Hopper backward cannot map its tensors for the TMA: {exc}") from exc


# ------------------------------------------------------------------------------------ custom op

def _backward_impl(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    dlse: Optional[torch.Tensor], cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_k: Optional[torch.Tensor],
    max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, window_left: int, window_right: int, softcap: float,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The op body: the kernel when it serves the call, else :func:`torch_backward` (warns once)."""
    try:
        cfg = check_supported(q, k, v, softcap, deterministic)

        def run(dout, q, k, v, out):
            return _kernel_backward(cfg, dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, softmax_scale, window_left, window_right, softcap, deterministic)  # fmt: skip

        if cfg.head_dim_v is not None or v.shape[-1] == q.shape[-1] == cfg.head_dim:  # the kernel takes them as is
            return run(dout, q, k, v, out)
        return padded_gradients(run, dout, q, k, v, out, kernel_head_dims=(cfg.head_dim,))
    except KernelUnsupported as exc:
        if q.is_cuda:
            warn_fallback_once("backward", str(exc))
    grads = torch_backward(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, softmax_scale, window_left,
                           window_right, softcap)  # fmt: skip
    return tuple(g.contiguous() for g in grads)  # contiguous, as the kernel's (and the fake's) are


def _backward_fake(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                   softmax_scale, window_left, window_right, softcap, deterministic):  # fmt: skip
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


_backward_op = define_op("attention_backward", _backward_impl, _backward_fake)


def attention_backward(
    dout, q, k, v, out, lse, *, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
    softmax_scale=None, causal=False, window_left=-1, window_right=-1, softcap=0.0, deterministic=False, dlse=None,
):  # fmt: skip
    """Gradients ``(dq, dk, dv)`` of attention by the CUDA kernel (layouts in the module docstring).

    ``dlse`` (optional, lse's shape): gradient flowing into the returned log-sum-exp. Raises
    :class:`KernelUnsupported` for a call the kernel does not serve (see :func:`torch_backward`).
    """
    if cu_seqlens_q is None:
        if q.dim() != 4:
            raise ValueError(f"q must be (B, S_q, H, D) without cu_seqlens, got {tuple(q.shape)}")
        max_seqlen_q, max_seqlen_k = q.shape[1], k.shape[1]
    elif max_seqlen_q is None or max_seqlen_k is None:
        raise ValueError("varlen backward needs max_seqlen_q and max_seqlen_k")
    out_shape = (*q.shape[:-1], v.shape[-1])  # (..., H, D_v)
    if tuple(dout.shape) != out_shape or tuple(out.shape) != out_shape:
        raise ValueError(f"dout and out must be {out_shape} (q's with v's head dim), got {tuple(dout.shape)} and "
                         f"{tuple(out.shape)}")  # fmt: skip
    check_supported(q, k, v, softcap, deterministic)
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    left, right = fold_window(causal, window_left, window_right)
    return _backward_op(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                        int(max_seqlen_k), scale, left, right, float(softcap or 0.0), bool(deterministic))  # fmt: skip


# ------------------------------------------------------------------------------------ autograd of the forward op


def _setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, scale, causal, left, right, softcap, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
    left, right = fold_window(causal, left, right)
    ctx.attrs = (int(max_q), int(max_k), float(scale), left, right, float(softcap or 0.0), bool(deterministic))


def _backward_fn(ctx, dout, dlse):
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    max_q, max_k, scale, left, right, softcap, deterministic = ctx.attrs
    if dout is None:
        dout = torch.zeros_like(out)
    # the op's body itself where nothing needs the op (plain eager backward: grad mode is off in it)
    dq, dk, dv = call_op(_backward_op, _backward_impl, dout, q, k, v, out, lse, dlse, cu_q, cu_k, max_q, max_k, scale,
                         left, right, softcap, deterministic)  # fmt: skip
    return dq, dk, dv, None, None, None, None, None, None, None, None, None, None


class EagerAttentionAutograd(torch.autograd.Function):
    """The forward op's autograd (``_setup_context`` / ``_backward_fn``, the same saved tensors and gradients) around
    the op's body, for plain eager training (:func:`.call_op`): no dispatcher on the way in or out. The forward
    module sets ``body`` (this module never imports it). Inputs and outputs are the op's: ``(q, k, v, cu_seqlens_q,
    cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap,
    deterministic)`` -> ``(out, lse)``, layouts as in the module docstring."""

    body = None

    @staticmethod
    def forward(ctx, *inputs):  # no separate setup_context: with one, apply binds the arguments by inspect per call
        output = EagerAttentionAutograd.body(*inputs)
        ctx.set_materialize_grads(False)  # an unused lse's gradient stays None, as the op's does
        _setup_context(ctx, inputs, output)
        return output

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dlse):
        return _backward_fn(ctx, dout, dlse)


_registered = False


def register_autograd() -> bool:
    """Attach the backward to ``hf_flashpatch::attention_forward`` if that op exists (idempotent).
    Returns whether the forward op is now differentiable through this module."""
    global _registered
    if _registered:
        return True
    try:
        torch.ops.hf_flashpatch.attention_forward  # noqa: B018 (lookup raises if the op is not defined yet)
    except (AttributeError, RuntimeError):
        return False
    torch.library.register_autograd("hf_flashpatch::attention_forward", _backward_fn, setup_context=_setup_context)
    _registered = True
    return True


register_autograd()  # a no-op until the forward module has defined the op; that module calls it again
