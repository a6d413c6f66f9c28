"""FlashAttention forward kernels as the custom op ``hf_flashpatch::attention_forward``: ``cuda/fwd.cu``
(mma.sync, every sm_80+ GPU and head dim) and, on Hopper at head dims 64/128 (and 192/128),
``cuda/fwd_hopper_ws.cu`` (wgmma, warp-specialised, K/V by TMA); which body serves a call is decided in
:mod:`hf_flashpatch.kernels.heuristics`.

Layouts (flash-attn's):

- batched: q ``(B, S_q, H, D)``, k/v ``(B, S_k, H_kv, D)``, any strides with a contiguous last dim
  (transformers' ``q.transpose(1, 2)`` views are read in place, never copied); returns
  ``out (B, S_q, H, D)`` contiguous in q's dtype and ``lse (B, H, S_q)`` fp32;
- varlen: q ``(T_q, H, D)``, k/v ``(T_k, H_kv, D)``, ``cu_seqlens_q/k`` int32 ``(N + 1,)``; returns
  ``out (T_q, H, D)`` and ``lse (H, T_q)``. ``max_seqlen_q`` sizes the grid and must be at least the
  longest query sequence (it is not checked: that would need a device-to-host copy);
- v may have a head dim of its own, ``D_v`` (multi-head latent attention): out then has ``D_v`` columns. A
  kernel takes the pair itself where one does (on Hopper: q/k 192 with v 128,
  :func:`~hf_flashpatch.kernels.heuristics.native_value_head_dim`), else the op runs the kernel on exactly
  zero-padded inputs (:mod:`.value_head_dim`). So does a head dim up to 256 that no build takes (16, 48, 80 as
  in Phi-2 and StableLM, 160, ...): zero-padded to the next of {32, 64, 96, 128, 256}, 96 skipped on
  Hopper (:func:`~hf_flashpatch.kernels.heuristics.padding_head_dims`).

``lse`` is the natural-log softmax denominator of the scaled (and soft-capped) scores; rows that see
no key get ``lse = -inf`` and ``out = 0``. Windows follow :mod:`hf_flashpatch.reference.masks`
(bottom-right aligned, -1 = unbounded). GQA/MQA are served natively: the query heads of a group are
packed into the rows of one query tile, so each K/V tile is loaded once per group.

What the kernel does not serve raises :class:`~hf_flashpatch.errors.KernelUnsupported` (the public
API then takes the torch fallback): dtypes other than fp16/bf16, head dims above 256 (q/k or v),
mismatched q/k/v dtypes or devices. Inputs whose strides or base address
are not 16-byte aligned are copied to contiguous tensors first (a documented, rare slow path); so are k
and v where the warp-specialised body streams them with the TMA and the driver cannot map their layout
(a broadcast head dim with stride 0, :mod:`.tma`).
The op's autograd is registered by :mod:`hf_flashpatch.kernels.backward`.
"""

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from ..errors import KernelUnsupported
from . import forward_torch, tail_split, work_list
from . import aligned, call_op, fold_scores, fold_window, kernels_unavailable_reason, warn_fallback_once
from .build import KernelBuild, device_arch, get_kernel, sm_count
from .forward_maps import kv_maps, output_map, packed_rows_map, query_map
from .heuristics import (HOPPER_VALUE_HEAD_DIM_SHAPES, HopperSchedule, TileShape, chain_form,
                         clustered_schedule, forward_tile_shape, hopper_forward_schedule, leading_rows,
                         native_value_head_dim, padding_head_dims, split_tail_parts)
from .value_head_dim import padded_attention, padded_head_dim

SUPPORTED_HEAD_DIMS = (32, 64, 96, 128, 256)
_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
_ZERO_SCALE = 1e-30  # stands in for softmax_scale = 0 (see _launch)
_ENTRY = "hfp_attention_forward"
_ENTRY_SM90_WS = "hfp_attention_forward_sm90_ws"  # same arguments
# A split last round's pieces (split_tail builds), launched after _ENTRY_SM90_WS with its parameters.
_ENTRY_SM90_WS_PIECES = "hfp_attention_forward_sm90_ws_pieces"
# FwdParams: k_tma v_tma q_tma o_tma | q k v out lse cu_q cu_k | 14 int64 strides | seqlen_q seqlen_k group left right |
# ScoreScale (3 floats) | total_q total_k | kv_heads num_seqs work_section q_box_heads o_box_heads leading_rows |
# tail_parts partials part_counters | work_list


@dataclass(frozen=True)
class ForwardConfig:
    """One compiled variant of ``cuda/fwd.cu``: the compile-cache key (through :meth:`build`)."""

    head_dim: int  # q's and k's
    dtype: str  # "bf16" or "fp16"
    block_m: int
    block_n: int
    num_warps: int
    kv_stages: int = 2
    q_in_registers: bool = False
    has_mask: bool = False  # causal / sliding window compiled in; the key-length bound is always on
    wgmma: bool = False  # Hopper body (cuda/fwd_hopper_ws.cu): a producer warpgroup + 64 rows per math warpgroup
    head_dim_v: int | None = None  # v's head dim where it differs from head_dim (HOPPER_VALUE_HEAD_DIM_SHAPES)
    q_by_tma: bool = False  # wgmma body: Q rows by a producer thread's TMA (TileShape.q_by_tma)
    own_key_tiles: bool = False  # wgmma body: each math warpgroup's own key tiles (TileShape.own_key_tiles)
    staged_output: bool = False  # wgmma body: the output through the Q rows (TileShape.staged_output)
    kv_cluster: int = 1  # wgmma body: CTAs sharing each K/V tile by a multicast (TileShape.kv_cluster)
    tma_output: bool = False  # wgmma body: the output by the TMA from each warp's Q rows (TileShape.tma_output)
    chained_walk: bool = False  # wgmma body: one key loop over a warpgroup's works (TileShape.chained_walk)
    warpgroup_turns: bool = False  # wgmma body: the math warpgroups' turns (TileShape.warpgroup_turns)
    split_tail: bool = False  # wgmma body: the last round split by key tiles (TileShape.split_tail)

    @property
    def value_dim(self) -> int:
        return self.head_dim if self.head_dim_v is None else self.head_dim_v

    def __post_init__(self):
        if self.wgmma:
            self._check_wgmma()
            return
        if self.head_dim_v is not None and self.head_dim_v != self.head_dim:
            raise ValueError(f"the mma.sync body takes one head dim for q, k and v, got {self}")
        if (self.q_by_tma or self.own_key_tiles or self.staged_output or self.kv_cluster != 1 or self.tma_output
                or self.chained_walk or self.warpgroup_turns or self.split_tail):
            raise ValueError(f"Q by the TMA, own key tiles, the staged output, the output boxes and the K/V multicast "
                             f"are the wgmma body's, as are the chained walk and the warpgroups' turns, "
                             f"got {self}")  # fmt: skip
        rows_per_warp = 16 * self.num_warps
        if self.head_dim not in SUPPORTED_HEAD_DIMS:
            raise ValueError(f"head_dim must be one of {SUPPORTED_HEAD_DIMS}, got {self.head_dim}")
        if self.dtype not in ("bf16", "fp16"):
            raise ValueError(f"dtype must be 'bf16' or 'fp16', got {self.dtype!r}")
        if self.block_m % rows_per_warp or self.block_n % 16 or self.kv_stages < 2:
            raise ValueError(f"invalid tile: block_m % (16 * num_warps) and block_n % 16 must be 0, got {self}")
        chunks_per_row = self.head_dim // 8
        if (self.block_m * chunks_per_row) % self.threads or (self.block_n * chunks_per_row) % self.threads:
            raise ValueError(f"tile rows x 16-byte chunks must divide over {self.threads} threads, got {self}")

    def _check_wgmma(self) -> None:
        if self.dtype not in ("bf16", "fp16"):
            raise ValueError(f"dtype must be 'bf16' or 'fp16', got {self.dtype!r}")
        warpgroups, rest = divmod(self.num_warps, 4)
        math_warpgroups = warpgroups - 1  # the first is the producer
        dims = (self.head_dim, self.value_dim)
        ok = (
            (dims in ((64, 64), (128, 128)) or dims in HOPPER_VALUE_HEAD_DIM_SHAPES)
            and self.block_n in (64, 128, 160) and rest == 0
            and (math_warpgroups == 2 or (math_warpgroups == 3 and dims == (64, 64)))
            and self.block_m == 64 * math_warpgroups
            and self.kv_stages >= 2
            and not self.q_in_registers
            and not (self.staged_output and (self.q_by_tma or self.value_dim != 128 or self.head_dim < 128))
            and not (self.tma_output and (self.staged_output or self.head_dim < self.value_dim
                                          or (self.q_by_tma and not (self.block_n == self.block_m == 128
                                                                     and self.head_dim == self.value_dim
                                                                     and self.kv_cluster == 1))))
            and (self.kv_cluster == 1 or (self.kv_cluster == 2 and not (self.has_mask or self.q_by_tma
                                                                        or self.own_key_tiles)))
            and not (self.chained_walk and (self.has_mask or not self.tma_output or self.block_n < 128
                                            or self.head_dim != self.value_dim or self.warpgroup_turns))
            and not (self.split_tail and not self.chained_walk)
        )  # fmt: skip
        if not ok:
            raise ValueError(f"invalid wgmma tile (head dims 64/64, 128/128 or "
                             f"{'/'.join(map(str, HOPPER_VALUE_HEAD_DIM_SHAPES))}; block_n 64/128/160, a producer "
                             f"warpgroup and 2 math warpgroups of 64 rows (3 at d64), >= 2 stages; the staged output "
                             f"at a v head dim of 128 with the Q rows copied; the output boxes not staged, with the Q "
                             f"rows copied or (staged in a K slot) on 128 x 128 tiles at one head dim; the K/V "
                             f"multicast over 2 CTAs unmasked, with the Q rows copied and every key tile computed; "
                             f"the chained walk unmasked, with the output boxes, at one head dim and >= 128-key "
                             f"tiles, without the warpgroups' turns; the split last round the chained walk's), "
                             f"got {self}")  # fmt: skip

    @classmethod
    def for_problem(cls, head_dim: int, dtype: str, has_mask: bool, shape: TileShape | None = None,
                    arch: str = "sm_80", head_dim_v: int | None = None):  # fmt: skip
        head_dim_v = None if head_dim_v == head_dim else head_dim_v
        shape = shape or forward_tile_shape(head_dim, arch, has_mask=has_mask, head_dim_v=head_dim_v)
        return _config_of(cls, head_dim, dtype, has_mask, shape, head_dim_v)

    @property
    def entry(self) -> str:
        return _ENTRY_SM90_WS if self.wgmma else _ENTRY

    @property
    def threads(self) -> int:
        return 32 * self.num_warps

    @functools.lru_cache(maxsize=None)  # made once per config and arch: every launch asks (configs are few)
    def build(self, arch: str = "sm_90a") -> KernelBuild:
        """The compile-cache key of this config on ``arch``."""
        if self.wgmma:
            if arch != "sm_90a":
                raise KernelUnsupported(f"the wgmma forward body needs sm_90a, got {arch}")
            math_warpgroups = self.num_warps // 4 - 1
            defines = (
                ("HEAD_DIM", self.head_dim), ("HEAD_DIM_V", self.value_dim), ("BLOCK_N", self.block_n),
                ("NUM_WG", math_warpgroups),
                ("KV_STAGES", self.kv_stages), ("Q_BY_TMA", int(self.q_by_tma)),
                ("OWN_KEY_TILES", int(self.own_key_tiles)), ("STAGED_OUTPUT", int(self.staged_output)),
                ("ELEM_BF16", int(self.dtype == "bf16")), ("HAS_MASK", int(self.has_mask)),
            )  # fmt: skip
            if self.kv_cluster != 1:  # the source's default is 1 (the other builds' keys unchanged)
                defines += (("KV_CLUSTER", self.kv_cluster),)
            if self.tma_output:  # the source's default is 0
                defines += (("TMA_OUTPUT", 1),)
            if self.chained_walk:  # the source's default is 0
                defines += (("CHAINED_WALK", 1),)
            if self.warpgroup_turns:  # the source's default is 0
                defines += (("WARPGROUP_TURNS", 1),)
            if self.split_tail:  # the source's default is 0
                defines += (("SPLIT_TAIL", 1),)
            return KernelBuild("fwd_hopper_ws.cu", tuple((name, str(value)) for name, value in defines), arch)
        defines = (
            ("HEAD_DIM", self.head_dim), ("BLOCK_M", self.block_m), ("BLOCK_N", self.block_n),
            ("NUM_WARPS", self.num_warps), ("KV_STAGES", self.kv_stages),
            ("Q_IN_REGS", int(self.q_in_registers)),
            ("ELEM_BF16", int(self.dtype == "bf16")), ("HAS_MASK", int(self.has_mask)),
        )  # fmt: skip
        return KernelBuild("fwd.cu", tuple((name, str(value)) for name, value in defines), arch)


@functools.lru_cache(maxsize=256)  # a config is validated once (every launch asks for its config)
def _config_of(cls, head_dim: int, dtype: str, has_mask: bool, shape: TileShape, head_dim_v: int | None):
    # every TileShape field is a ForwardConfig field of the same name (vars: a shallow read; dataclasses.asdict
    # deep-copies, 30x the time)
    return cls(head_dim=head_dim, dtype=dtype, has_mask=has_mask, head_dim_v=head_dim_v, **vars(shape))


def all_builds(arch: str = "sm_90a") -> list[KernelBuild]:
    """Every build shipped for ``arch``: dtype x head dim (and the v head dims of their own the arch's kernels
    take) x masking x the Hopper walk's forms (a chained shape: with its split last round, without, work by work),
    and a K/V multicast shape's plain build (the CI compile check walks this list)."""
    dims = [(head_dim, None) for head_dim in SUPPORTED_HEAD_DIMS]
    dims += [pair for pair in HOPPER_VALUE_HEAD_DIM_SHAPES if native_value_head_dim(*pair, arch)]

    def with_plain(shape: TileShape) -> tuple[TileShape, ...]:  # the builds a walk without clusters or boxes launches
        shapes = (shape, dataclasses.replace(shape, kv_cluster=1)) if shape.kv_cluster > 1 else (shape,)
        if shape.chained_walk:  # without the split round, and the same tiles walked work by work
            unsplit = tuple(dataclasses.replace(s, split_tail=False) for s in shapes) if shape.split_tail else ()
            shapes += unsplit + tuple(dataclasses.replace(s, chained_walk=False, split_tail=False) for s in shapes)
        return shapes

    builds = [
        ForwardConfig.for_problem(head_dim, dtype, has_mask, shape, arch=arch, head_dim_v=head_dim_v).build(arch)
        for dtype in ("bf16", "fp16")
        for head_dim, head_dim_v in dims
        for has_mask in (False, True)
        for walk_shape in dict.fromkeys(forward_tile_shape(head_dim, arch, has_mask, head_dim_v, one_cta_per_tile)
                                        for one_cta_per_tile in (False, True))  # fmt: skip
        for shape in with_plain(walk_shape)
    ]
    return list(dict.fromkeys(builds))


# --------------------------------------------------------------------------------------- checks


def _check_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dtype not in _DTYPE_NAMES:
        raise KernelUnsupported(f"the forward kernel takes float16/bfloat16, got {q.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise KernelUnsupported(f"the forward kernel needs one dtype for q, k, v, got {q.dtype}, {k.dtype}, {v.dtype}")
    head_dim, head_dim_v = q.shape[-1], v.shape[-1]
    # a build's head dim, a native pair (the arch is checked at launch), or zero-padded to a build's head dim
    served = (head_dim, head_dim_v) in HOPPER_VALUE_HEAD_DIM_SHAPES or padded_head_dim(
        head_dim, head_dim_v, SUPPORTED_HEAD_DIMS) in SUPPORTED_HEAD_DIMS  # fmt: skip
    if k.shape[-1] != head_dim or not served:
        raise KernelUnsupported(
            f"the forward kernel takes q/k and v head dims up to {SUPPORTED_HEAD_DIMS[-1]} (q's and k's equal), "
            f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if not (q.is_cuda and k.device == q.device and v.device == q.device):
        raise KernelUnsupported(f"the forward kernel needs q, k, v on one CUDA device, got {q.device}, {k.device}, {v.device}")
    if q.shape[-2] % k.shape[-2]:
        raise KernelUnsupported(f"kv heads must divide q heads, got {q.shape[-2]} and {k.shape[-2]}")


def native_value_head_dim_for(q: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether a forward kernel takes q's head dim with v's (of its own) on q's device (no padding needed)."""
    return q.is_cuda and native_value_head_dim(q.shape[-1], v.shape[-1], device_arch(q.device))


def arch_of(q: torch.Tensor) -> str | None:
    """The kernels' arch for q's device (None off CUDA)."""
    return device_arch(q.device) if q.is_cuda else None


def needs_padding(q: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the op runs the kernel on zero-padded inputs (:mod:`.value_head_dim`): v's head dim differs from q's
    in a pair no kernel takes, or q's is none the padding takes as it is on this arch
    (:func:`.heuristics.padding_head_dims`: no build's, or 96 on Hopper)."""
    if v.shape[-1] != q.shape[-1]:
        return not native_value_head_dim_for(q, v)
    return q.shape[-1] not in padding_head_dims(SUPPORTED_HEAD_DIMS, arch_of(q))


# --------------------------------------------------------------------------------------- launch


def _split_tail(config: ForwardConfig, ctas: int, works: int, seqlen_k: int, masked_or_varlen: bool,
                device: torch.device):  # fmt: skip
    """``(partials, part_counters, tail_parts)`` of a launch (``tail_split.partials``) where ``config`` splits its last
    round (``split_tail``: ``heuristics.chain_form`` chose it), else ``(None, None, 0)``."""
    if not config.split_tail or masked_or_varlen:
        return None, None, 0
    tail_parts = split_tail_parts(works, ctas, config.kv_cluster, -(-seqlen_k // config.block_n))
    if not tail_parts:
        return None, None, 0
    math_warps = config.num_warps - 4  # the first warpgroup produces
    return (*tail_split.partials(tail_parts, works, ctas, math_warps, config.value_dim, device), tail_parts)


def _launch(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
            window_left, window_right, softcap, shape: TileShape | None = None,
            schedule: HopperSchedule | None = None):  # fmt: skip
    """Allocate ``out``/``lse`` and run the kernel. Layouts as in the module docstring. ``shape`` / ``schedule``:
    another tile shape / Hopper grid and work order than the heuristics' (benchmarks and tests); a ``shape`` given
    is launched as it is, whatever the walk, except that its K/V multicast (``kv_cluster``) serves only where
    ``heuristics.clustered_schedule`` allows it (a schedule's own ``kv_cluster`` is not read)."""
    _check_supported(q, k, v)
    varlen = cu_seqlens_q is not None
    q, k, v = aligned(q), aligned(k), aligned(v)
    heads, kv_heads, head_dim, head_dim_v = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    group = heads // kv_heads
    left, right = fold_window(causal, window_left, window_right)
    arch = device_arch(q.device)
    if head_dim_v != head_dim and not native_value_head_dim(head_dim, head_dim_v, arch):
        raise KernelUnsupported(f"no forward kernel takes head dims {head_dim} / {head_dim_v} on {arch}")

    out = q.new_empty((*q.shape[:-1], head_dim_v))  # (B, S_q, H, D_v) or (T_q, H, D_v), contiguous
    if varlen:
        num_seqs = cu_seqlens_q.numel() - 1
        total_q = q.shape[0]
        lse = torch.empty((heads, total_q), dtype=torch.float32, device=q.device)  # (H, T_q)
        seqlen_q, seqlen_k = int(max_seqlen_q), int(max_seqlen_k)
        q_strides = (0, q.stride(0), q.stride(1))
        k_strides = (0, k.stride(0), k.stride(1))
        v_strides = (0, v.stride(0), v.stride(1))
        o_strides = (0, out.stride(0), out.stride(1))
        lse_strides = (0, total_q)
        cu_seqlens_q = cu_seqlens_q.to(torch.int32).contiguous()
        cu_seqlens_k = cu_seqlens_k.to(torch.int32).contiguous()
    else:
        num_seqs, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
        lse = torch.empty((num_seqs, heads, seqlen_q), dtype=torch.float32, device=q.device)  # (B, H, S_q)
        q_strides, k_strides, v_strides = q.stride()[:3], k.stride()[:3], v.stride()[:3]
        o_strides = out.stride()[:3]
        lse_strides = (heads * seqlen_q, seqlen_q)
    if out.numel() == 0 or num_seqs == 0 or seqlen_q == 0:
        lse.fill_(float("-inf"))
        return out.zero_(), lse
    if num_seqs > 65535 or kv_heads > 65535:
        raise KernelUnsupported(f"grid limit: at most 65535 sequences and kv heads, got {num_seqs} and {kv_heads}")

    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)  # 0.0 is a scale of 0
    if scale < 0:  # the online softmax takes the running max of the raw scores: right for scale >= 0 only
        raise KernelUnsupported(f"the forward kernel takes softmax_scale >= 0, got {scale}")
    if scale == 0:  # every score is 0 (softcap * tanh(0) too), but the kernel folds the scale into exp2
        # after masking with -inf, and -inf * 0 is NaN; exp2(score * _ZERO_SCALE) rounds to exactly 1.
        scale, softcap = _ZERO_SCALE, 0.0
    scales = fold_scores(scale, softcap if softcap and softcap > 0 else 0.0)  # the kernel caps for softcap > 0 only

    masked = left >= 0 or right >= 0
    chosen = shape or forward_tile_shape(head_dim, arch, masked, head_dim_v)
    m_blocks = math.ceil(seqlen_q * group / chosen.block_m)
    section, listed = 0, None
    if chosen.wgmma:  # CTAs walking work tiles (fwd_hopper_ws.cu): heuristics.hopper_forward_schedule
        kv_bytes = seqlen_k * (head_dim + head_dim_v) * q.element_size()  # one pair's K and V
        walk = schedule or hopper_forward_schedule(seqlen_q, seqlen_k, group, chosen.block_m, chosen.block_n, left,
                                                   right, kv_heads * num_seqs, sm_count(q.device.index), varlen,
                                                   kv_bytes, chosen.own_key_tiles)  # fmt: skip
        if shape is None and walk.one_cta_per_tile(m_blocks * kv_heads * num_seqs):
            chosen = forward_tile_shape(head_dim, arch, masked, head_dim_v, one_cta_per_tile=True)
        grid, section = (walk.ctas, 1, 1), walk.section
        if walk.listed is not None:  # the host's list, pair-major work indices; while uploading it cannot, the snake
            listed = work_list.on_device(walk.listed, q.device)
            section = 0 if listed is not None else walk.section
    else:
        grid = (m_blocks, kv_heads, num_seqs)
    config = ForwardConfig.for_problem(head_dim, _DTYPE_NAMES[q.dtype], masked, chosen, arch, head_dim_v)
    if config.kv_cluster > 1:  # the K/V multicast where the walk can take clusters, else the shape's plain build
        clustered = config
        walk = clustered_schedule(walk, config.kv_cluster, m_blocks, masked, varlen,
                                  lambda: get_kernel(clustered.build(arch), clustered.entry, q.device).resident_clusters(
                                      clustered.kv_cluster, clustered.threads))  # fmt: skip
        if walk.kv_cluster == 1:  # (a new config, validated, only on this path)
            config = dataclasses.replace(config, kv_cluster=1)
    q_tma, q_box_heads = query_map(config, q, group)
    o_tma, o_box_heads = output_map(config, out, group, varlen, q_box_heads)
    if config.chained_walk:
        config = chain_form(config, seqlen_k, o_box_heads > 0, m_blocks * kv_heads * num_seqs, grid[0])
    if config.chained_walk:  # each warp loads its next 16 Q rows by the output boxes' geometry
        chain_q_tma, chain_q_box_heads = packed_rows_map(True, q, 16, group)
        if chain_q_box_heads:
            q_tma, q_box_heads = chain_q_tma, chain_q_box_heads
        else:  # a q the driver cannot map: the same tiles work by work (the same bits)
            config = dataclasses.replace(config, chained_walk=False, split_tail=False)
    if listed is not None and config.chained_walk:  # its math warps walk rounds (chain_work), the producer the list
        raise RuntimeError(f"internal: a listed walk chosen for a chained build ({config})")
    build = config.build(arch)
    kernel = get_kernel(build, config.entry, q.device)
    k, v, k_tma, v_tma = kv_maps(config, k, v)
    # A masked walk's first tile of a sequence leads it by this many rows (heuristics.leading_rows). Not for varlen
    # (the sequences' lengths are not known here) nor with output boxes (a box at a row before the sequence, a
    # negative coordinate, faults the TMA: an illegal instruction, measured).
    lead = 0
    if chosen.wgmma and masked and not varlen and not o_box_heads:
        lead = leading_rows(seqlen_q * group, config.block_m)
    partials, part_counters, tail_parts = _split_tail(config, grid[0], m_blocks * kv_heads * num_seqs, seqlen_k,
                                                      masked or varlen, q.device)  # fmt: skip
    if config.split_tail and not tail_parts:  # its first entry walks the full rounds only: the last round unwritten
        raise RuntimeError(f"internal: a split build chosen where no last round splits ({config})")
    args = (
        k_tma, v_tma, q_tma, o_tma, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
        *q_strides, *k_strides, *v_strides, *o_strides, *lse_strides,
        seqlen_q, seqlen_k, group, left, right, *scales,
        q.shape[0], k.shape[0],  # varlen: total rows, the bound of every cu_seqlens read
        kv_heads, num_seqs, section, q_box_heads, o_box_heads, lead, tail_parts, partials, part_counters, listed,
    )  # fmt: skip
    tensors = tuple(t for t in (q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, partials, part_counters, listed)
                    if t is not None)  # fmt: skip
    kernel(grid, (config.threads, 1, 1), *args, shared_bytes=kernel.shared_bytes, tensors=tensors)
    if tail_parts:  # the split last round's pieces: a kernel of their own, after the full rounds
        pieces = get_kernel(build, _ENTRY_SM90_WS_PIECES, q.device)
        pieces(grid, (config.threads, 1, 1), *args, shared_bytes=pieces.shared_bytes, tensors=tensors)
    return out, lse


def _attention_forward_impl(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: Optional[torch.Tensor],
    cu_seqlens_k: Optional[torch.Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The op behind :func:`attention_forward` (softcap 0.0 = off): the kernel where it serves the call,
    else the exact torch path of :mod:`.forward_torch` (CPU, and CUDA calls the kernel declines, with one
    warning per reason). The forward pass is deterministic regardless of ``deterministic``, which the
    backward reads."""
    try:
        unavailable = kernels_unavailable_reason(q)
        if unavailable is not None:
            raise KernelUnsupported(unavailable)
        if needs_padding(q, v):
            _check_supported(q, k, v)  # before padding anything

            def launch_padded(q_p, k_p, v_p, softmax_scale):  # (..., P) each
                return _launch(q_p, k_p, v_p, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                               causal, window_left, window_right, softcap)  # fmt: skip

            widths = padding_head_dims(SUPPORTED_HEAD_DIMS, arch_of(q))
            return padded_attention(launch_padded, q, k, v, kernel_head_dims=widths, softmax_scale=softmax_scale)
        return _launch(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                       window_left, window_right, softcap)  # fmt: skip
    except KernelUnsupported as exc:
        if q.is_cuda:
            warn_fallback_once("forward", str(exc))
    left, right = fold_window(causal, window_left, window_right)
    if cu_seqlens_q is not None:
        return forward_torch.varlen_attention_with_lse(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, left,
                                                       right, softcap)  # fmt: skip
    return forward_torch.attention_with_lse(q, k, v, softmax_scale, left, right, softcap)


attention_forward_op = torch.library.custom_op("hf_flashpatch::attention_forward", mutates_args=())(
    _attention_forward_impl
)


@attention_forward_op.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
      window_right, softcap, deterministic):  # fmt: skip
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))  # (..., D_v), contiguous, like the kernel's
    if cu_seqlens_q is not None:
        lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)  # (H, T_q)
    else:
        lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)  # (B, H, S_q)
    return out, lse


def attention_forward(
    q, k, v, *, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
    causal: bool, softmax_scale: float | None, window_left: int, window_right: int, softcap: float | None,
    deterministic: bool = False, torch_fallback: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Run the forward kernel; returns ``(out, lse)`` (layouts in the module docstring).

    Raises :class:`KernelUnsupported` for inputs the kernel does not serve, before anything runs; with
    ``torch_fallback=True`` the op computes such calls with its torch path instead, a choice made at run
    time inside the op, so the call traces to one graph node under ``torch.compile`` on every device.
    """
    if not torch_fallback:
        _check_supported(q, k, v)
    varlen = cu_seqlens_q is not None
    if varlen != (cu_seqlens_k is not None):
        raise ValueError(f"pass both cu_seqlens_q and cu_seqlens_k or neither, got {cu_seqlens_q!r}, {cu_seqlens_k!r}")
    if varlen:
        if q.dim() != 3:
            raise ValueError(f"varlen q must be (T_q, H, D), got {tuple(q.shape)}")
        if max_seqlen_q is None or max_seqlen_k is None:
            raise ValueError(f"varlen needs max_seqlen_q and max_seqlen_k, got {max_seqlen_q}, {max_seqlen_k}")
    elif q.dim() != 4:
        raise ValueError(f"batched q must be (B, S_q, H, D), got {tuple(q.shape)}")
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    return call_op(
        attention_forward_op, _attention_forward_impl, q, k, v, cu_seqlens_q, cu_seqlens_k,
        int(max_seqlen_q or 0), int(max_seqlen_k or 0), scale, bool(causal),
        int(window_left), int(window_right), float(softcap or 0.0), bool(deterministic),
        eager_autograd=EagerAttentionAutograd,
    )  # fmt: skip


# The op's autograd lives in the backward module, which never imports this one (no import cycle).
from .backward import EagerAttentionAutograd  # noqa: E402
from .backward import register_autograd as _register_autograd  # noqa: E402

_register_autograd()
EagerAttentionAutograd.body = staticmethod(_attention_forward_impl)
