"""Input checks for the public API. Every error names the argument and what was received.

Two kinds of check:

- **structure** (shapes, dtypes, devices, scalar arguments): always; they cost nothing.
- **contents** of index tables (``cu_seqlens``, page tables, per-sequence lengths), which need the
  tensors' values. They run always for CPU tables, and for CUDA tables in eager mode unless the
  caller passes ``check_inputs=False``, as one combined check per call that costs one
  device-to-host copy (one sync). They never run while ``torch.compile`` traces or while a CUDA
  graph is being captured: the values are not known there. Unchecked tables cannot make a kernel
  read or write outside the tensors passed (the kernels clamp every table read), but invalid ones
  give wrong numbers.
"""

from __future__ import annotations

import math
import numbers
import operator

import torch

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256
_SHOWN = 16  # table values quoted in an error message


def _fail(message: str):
    raise ValueError(message)


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, packed: bool,
              names: tuple[str, str, str] = ("q", "k", "v")) -> None:
    """Batched: q ``(B, S_q, H, D)``, k ``(B, S_k, H_kv, D)``, v ``(B, S_k, H_kv, D_v)``. Packed: q ``(T_q, H, D)``,
    k ``(T_k, H_kv, D)``, v ``(T_k, H_kv, D_v)``. v's head dim ``D_v`` may differ from ``D`` (multi-head latent
    attention); every other dim of k and v must match. ``names``: what q, k and v are in the caller's signature
    (``k_cache``, ``k_pool``, ...), for the errors.

    Every decode layer of every step runs this, so the accepted case costs a handful of compares; the messages
    are built only on the way to an error."""
    rank = 3 if packed else 4
    if type(q) is not torch.Tensor or type(k) is not torch.Tensor or type(v) is not torch.Tensor:
        for name, t in zip(names, (q, k, v)):  # subclasses (fake, functional tensors) are tensors too
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    q_shape, k_shape, v_shape = q.shape, k.shape, v.shape
    dtype, head_dim, head_dim_v = q.dtype, q_shape[-1] if q_shape else 0, v_shape[-1] if v_shape else 0
    if not (
        len(q_shape) == len(k_shape) == len(v_shape) == rank
        and dtype in SUPPORTED_DTYPES and dtype == k.dtype == v.dtype
        and q.device == k.device == v.device
        and q.layout == k.layout == v.layout == torch.strided
        and k_shape[:-1] == v_shape[:-1] and (packed or k_shape[0] == q_shape[0]) and k_shape[-1] == head_dim
        and 0 < head_dim <= MAX_HEAD_DIM and 0 < head_dim_v <= MAX_HEAD_DIM
        and k_shape[-2] != 0 and q_shape[-2] % k_shape[-2] == 0
    ):  # fmt: skip
        _explain_qkv(q, k, v, rank, "(total, heads, head_dim)" if packed else "(batch, seqlen, heads, head_dim)",
                     packed, names)  # fmt: skip


def _explain_qkv(q, k, v, rank: int, layout: str, packed: bool, names: tuple[str, str, str]) -> None:
    """Raise the error that names the first thing :func:`check_qkv` refuses."""
    nq, nk, nv = names
    for name, t in zip(names, (q, k, v)):
        if t.dim() != rank:
            _fail(f"{name} must be {rank}-D {layout}, got shape {tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{nq}, {nk}, {nv} must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        _fail(f"{nq}, {nk}, {nv} must be on one device, got {q.device}, {k.device}, {v.device}")
    for name, t in zip(names, (q, k, v)):
        if t.layout != torch.strided:
            raise TypeError(f"{name} must be a dense (strided) tensor, got layout {t.layout}")
    if k.shape[:-1] != v.shape[:-1]:
        _fail(f"{nk} and {nv} must have the same shape except the last dim ({nv}'s head_dim may differ), got "
              f"{tuple(k.shape)} and {tuple(v.shape)}")  # fmt: skip
    if not packed and k.shape[0] != q.shape[0]:
        _fail(f"{nq} and {nk} must have the same batch, got {tuple(q.shape)} and {tuple(k.shape)}")
    head_dim = q.shape[-1]
    if k.shape[-1] != head_dim:
        _fail(f"{nq} and {nk} must have the same head_dim, got {tuple(q.shape)} and {tuple(k.shape)}")
    check_head_dim(head_dim, f" ({nq} shape {tuple(q.shape)})")
    check_head_dim(v.shape[-1], f" ({nv}'s head_dim, {nv} shape {tuple(v.shape)})")
    heads, kv_heads = q.shape[-2], k.shape[-2]
    _fail(f"{nk}/{nv} heads must divide {nq} heads (GQA/MQA), got {heads} {nq} heads and {kv_heads} kv heads")


def check_head_dim(head_dim: int, where: str = "") -> None:
    if head_dim == 0 or head_dim > MAX_HEAD_DIM:
        _fail(f"head_dim must be in 1..{MAX_HEAD_DIM}, got {head_dim}{where}")


# ------------------------------------------------------------------------------------ scalar arguments


def _is_real(x) -> bool:
    """A Python int or float (not a bool), or a NumPy real scalar: what the kernels' fp32 parameters and torch's
    ops take. Other ``numbers.Real`` types (``Fraction``) would reach torch and fail there."""
    if type(x) is float or type(x) is int:  # the common case, without the numbers.Real ABC's isinstance
        return True
    if isinstance(x, bool):
        return False
    return isinstance(x, (int, float)) or (isinstance(x, numbers.Real) and type(x).__module__ == "numpy")


def _fp32_magnitude(x) -> float:
    """``abs(x)`` as a float, inf past float64's range (a huge Python int cannot become a float)."""
    try:
        return abs(float(x))
    except OverflowError:
        return math.inf


_FLOAT32_MAX = torch.finfo(torch.float32).max
_INT32_MAX = 2**31 - 1


def check_scalars(softmax_scale, softcap, window, causal=False) -> float | None:
    """Check ``softmax_scale``, ``softcap``, ``window`` and ``causal``; return the softcap to apply (None = no cap).

    ``softcap`` 0, None and values that are +inf in fp32 (the precision scores are computed in) all mean no cap
    (``inf * tanh(s / inf)`` is ``s``); NaN, negative or non-numbers are errors, as are a ``softmax_scale`` that
    is NaN or infinite in fp32 (0.0 is a valid scale: all scores 0), window sides that are not ints (a float
    would be truncated silently), below -1 (only -1 and None mean unbounded; flash-attn reads any negative so) or
    past int32, and a ``causal`` that is not a bool (a string such as ``"no"`` would read as true).
    """
    if not (isinstance(causal, int) and causal in (0, 1)):  # a bool is an int
        raise TypeError(f"causal must be a bool, got {type(causal).__name__} {causal!r}")
    if softmax_scale is not None:
        if not _is_real(softmax_scale):
            got = f"{type(softmax_scale).__name__} {softmax_scale!r}"
            raise TypeError(f"softmax_scale must be a float or None, got {got}")
        if not _fp32_magnitude(softmax_scale) <= _FLOAT32_MAX:  # NaN fails too
            _fail(f"softmax_scale must be finite in fp32 (None = 1/sqrt(head_dim)), got {softmax_scale}")
    if softcap is not None:
        if not _is_real(softcap):
            raise TypeError(f"softcap must be a float or None, got {type(softcap).__name__} {softcap!r}")
        if not softcap >= 0:  # NaN fails too (an int compares exactly, however large)
            _fail(f"softcap must be >= 0 (0, None or inf = no cap), got {softcap}")
    if window is not None:
        if not (isinstance(window, (tuple, list)) and len(window) == 2):
            _fail(f"window must be a (left, right) pair (None or -1 = unbounded), got {window!r}")
        for side, value in zip(("left", "right"), window):
            if value is None:
                continue
            try:
                if isinstance(value, bool):
                    raise TypeError
                operator.index(value)
            except TypeError:
                raise TypeError(
                    f"window {side} must be an int or None (-1/None = unbounded), got {type(value).__name__} "
                    f"{value!r} in window={window!r}"
                ) from None
            if not -1 <= operator.index(value) <= _INT32_MAX:  # flash-attn reads any negative as unbounded; a
                # miscomputed window (sliding_window - 6) would silently widen to the whole sequence
                _fail(f"window {side} must be -1/None (unbounded) or in 0..2**31-1, got {value} in window={window!r}")
    return float(softcap) if softcap and softcap <= _FLOAT32_MAX else None


def check_flags(**flags) -> None:
    """Boolean arguments (``return_lse``, ``deterministic``, ``check_inputs``): a bool or 0/1; a string such as
    ``"no"`` would read as true."""
    for name, value in flags.items():
        if not (isinstance(value, int) and value in (0, 1)):  # a bool is an int
            raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")


# ------------------------------------------------------------------------------------ table structure


def check_sinks(sinks, q: torch.Tensor):
    """``sinks``: None, or a floating tensor of one logit per query head ``(H,)`` on q's device."""
    if sinks is None:
        return None
    if not isinstance(sinks, torch.Tensor):
        raise TypeError(f"sinks must be a torch.Tensor of shape ({q.shape[-2]},) or None, got {type(sinks).__name__}")
    if sinks.shape != (q.shape[-2],) or not sinks.is_floating_point():
        _fail(f"sinks must be a floating tensor of one logit per query head, shape ({q.shape[-2]},), got "
              f"{sinks.dtype} of shape {tuple(sinks.shape)}")  # fmt: skip
    if sinks.device != q.device:
        _fail(f"sinks must be on q's device {q.device}, got {sinks.device}")
    return sinks


def check_cu_seqlens(cu: torch.Tensor, name: str, device: torch.device) -> None:
    """Structure of a ``(num_seqs + 1,)`` int table; its contents are :func:`check_varlen_contents`'s."""
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(cu).__name__}")
    if cu.dim() != 1 or cu.numel() < 2:
        _fail(f"{name} must be 1-D (num_seqs + 1,), got shape {tuple(cu.shape)}")
    if cu.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 or int64, got {cu.dtype}")
    if cu.device != device:
        _fail(f"{name} must be on {device}, got {cu.device}")


def _check_table_device(t: torch.Tensor, name: str, device: torch.device) -> None:
    """A table on ``device`` or on the CPU (the kernel layer moves a host table to q's device)."""
    if t.device != device and t.device.type != "cpu":
        where = "the cpu" if device.type == "cpu" else f"{device} or the cpu"
        _fail(f"{name} must be on {where}, got {t.device}")


def check_int_vector(t, name: str, length: int, device: torch.device) -> None:
    """A ``(length,)`` int32/int64 table on ``device`` or the CPU."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.shape != (length,):
        _fail(f"{name} must be ({length},), got {tuple(t.shape)}")
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
    _check_table_device(t, name, device)


def check_writable_pool(pool: torch.Tensor, name: str) -> None:
    """A KV pool that can be written in place, row by row: no dimension of more than one element with stride 0
    (an expanded view would take every row's write in one place), not a leaf that requires grad (or a view of
    one) while grad mode is on, not an inference tensor outside ``torch.inference_mode``: torch refuses the last
    two only when it writes, which for the second pool would be after the first was written. Checked for both
    pools before either is written, so a refused call changes nothing."""
    if any(stride == 0 and size > 1 for stride, size in zip(pool.stride(), pool.shape)):
        _fail(f"{name} must not be an expanded view (stride 0 takes every row's write in one place), got shape "
              f"{tuple(pool.shape)} with strides {pool.stride()}")  # fmt: skip
    if torch.compiler.is_compiling():  # dynamo traces neither flag; the compiled graph's own checks hold there
        return
    base = pool if pool._base is None else pool._base
    if base.is_leaf and base.requires_grad and torch.is_grad_enabled():
        _fail(f"{name} is (a view of) a leaf that requires grad: a KV pool is written in place; allocate it without "
              "requires_grad or call under torch.no_grad() / torch.inference_mode()")  # fmt: skip
    if pool.is_inference() and not torch.is_inference_mode_enabled():
        _fail(f"{name} was created under torch.inference_mode() and can only be written inside it (torch "
              "refuses in-place updates of inference tensors elsewhere)")  # fmt: skip


# ------------------------------------------------------------------------------------ table contents


def content_checks_enabled(check_inputs: bool, *tables: torch.Tensor) -> bool:
    """Whether the contents of ``tables`` are checked now (see the module docstring)."""
    if torch.compiler.is_compiling() or any(t.device.type == "meta" for t in tables):
        return False  # no values to read
    if not any(t.is_cuda for t in tables):
        return True  # host values: reading them costs no sync
    return bool(check_inputs) and not torch.cuda.is_current_stream_capturing()


def _to_host(*tensors: torch.Tensor) -> list[list[int]]:
    """The values of small int tensors as lists, with one device-to-host copy for all of them."""
    device = next((t.device for t in tensors if t.is_cuda), torch.device("cpu"))
    flat = [t.reshape(-1).to(device=device, dtype=torch.int64) for t in tensors]
    joined = torch.cat(flat).tolist()  # the call's one sync on CUDA
    out, start = [], 0
    for f in flat:
        out.append(joined[start : start + f.numel()])
        start += f.numel()
    return out


def _quote(values: list[int]) -> str:
    if len(values) <= _SHOWN:
        return str(values)
    return f"[{', '.join(map(str, values[:_SHOWN]))}, ...] ({len(values)} values)"


def _check_cu_values(cu: list[int], name: str, total: int, rows: str) -> None:
    if cu[0] != 0:
        _fail(f"{name} must start at 0, got {name}[0] = {cu[0]} (values {_quote(cu)})")
    for i in range(1, len(cu)):
        if cu[i] < cu[i - 1]:
            _fail(f"{name} must be non-decreasing, got {name}[{i}] = {cu[i]} after {name}[{i - 1}] = {cu[i - 1]} "
                  f"(values {_quote(cu)})")  # fmt: skip
    if cu[-1] > total:
        _fail(f"{name} ends at {cu[-1]} but {rows} has only {total} rows (values {_quote(cu)})")


def check_varlen_contents(cu_seqlens_q, cu_seqlens_k, total_q: int, total_k: int, max_seqlen_q, max_seqlen_k,
                          keys_name: str = "k") -> int:  # fmt: skip
    """``cu_seqlens_*`` start at 0, never decrease and end within q/k's rows (rows past the end are
    padding that belongs to no sequence), and ``max_seqlen_*`` bound every sequence (the kernels
    size their grids by them). ``keys_name``: what holds the keys' rows, as the caller's errors name it.
    Returns ``cu_seqlens_q[-1]``, where q's padding rows start."""
    cq, ck = _to_host(cu_seqlens_q, cu_seqlens_k)
    for cu, name, total, rows, longest, max_name in (
        (cq, "cu_seqlens_q", total_q, "q", max_seqlen_q, "max_seqlen_q"),
        (ck, "cu_seqlens_k", total_k, keys_name, max_seqlen_k, "max_seqlen_k"),
    ):
        _check_cu_values(cu, name, total, rows)
        lengths = [b - a for a, b in zip(cu, cu[1:])]
        seq = max(range(len(lengths)), key=lengths.__getitem__)
        if lengths[seq] > int(longest):
            _fail(f"{max_name} = {int(longest)} is less than sequence {seq}'s {lengths[seq]} rows "
                  f"({name} {_quote(cu)}); the kernels would leave rows past {max_name} unwritten")  # fmt: skip
    return cq[-1]


def check_cache_seqlens_contents(cache_seqlens: torch.Tensor, cache_len: int) -> None:
    """Every ``cache_seqlens[b]`` in ``[0, S_cache]``."""
    (lengths,) = _to_host(cache_seqlens)
    for b, n in enumerate(lengths):
        if not 0 <= n <= cache_len:
            _fail(f"cache_seqlens[{b}] = {n} is outside [0, {cache_len}] (the cache holds {cache_len} tokens per row)")


def check_page_table_contents(page_table: torch.Tensor, seqlens: torch.Tensor, num_pages: int, page_size: int,
                              seqlens_name: str = "seqlens_k") -> None:  # fmt: skip
    """Every length in ``[0, max_pages * page_size]`` and every page a sequence reads (the first
    ``ceil(len / page_size)`` of its row) in ``[0, num_pages)``; entries past them are never read."""
    rows, max_pages = page_table.shape
    table = page_table.to(torch.int64)
    lens = seqlens.to(device=table.device, dtype=torch.int64)
    used = (lens.clamp(0, max_pages * page_size) + page_size - 1) // page_size  # (B,) pages each row reads
    cols = torch.arange(max_pages, device=table.device)  # (max_pages,)
    bad = (cols < used[:, None]) & ((table < 0) | (table >= num_pages))  # (B, max_pages)
    if max_pages:
        first_bad = torch.where(bad, cols, max_pages).amin(dim=1)  # (B,) first bad column, max_pages: none
    else:
        first_bad = torch.zeros_like(used)  # no columns: any length > 0 fails below
    lengths, first = _to_host(lens, first_bad)
    for b in range(rows):
        if lengths[b] < 0:
            _fail(f"{seqlens_name}[{b}] = {lengths[b]} is negative")
        if lengths[b] > max_pages * page_size:
            need = -(-lengths[b] // page_size)
            _fail(f"sequence {b} has {lengths[b]} tokens = {need} pages of {page_size}, but page_table has only "
                  f"{max_pages} columns ({seqlens_name}[{b}] = {lengths[b]})")  # fmt: skip
        if first[b] < max_pages:
            col = first[b]
            _fail(f"page_table[{b}, {col}] = {int(page_table[b, col])} is not a page of this pool "
                  f"(valid: 0..{num_pages - 1})")  # fmt: skip


# ------------------------------------------------------------------------------------ per public function


def check_varlen(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, check_inputs: bool,
                 keys_name: str = "k") -> int | None:  # fmt: skip
    """flash_attn_varlen_func's tables: structure always, contents as the module docstring says. ``keys_name``:
    what ``k`` is in the caller's signature (the slot function passes its ``slots``). Returns
    ``cu_seqlens_q[-1]`` where the contents were checked (the host read it), else None."""
    check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", q.device)
    check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k", q.device)
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        _fail(f"cu_seqlens_q and cu_seqlens_k must describe the same number of sequences, got "
              f"{cu_seqlens_q.numel() - 1} and {cu_seqlens_k.numel() - 1}")  # fmt: skip
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        try:
            if isinstance(value, bool):
                raise TypeError
            negative = operator.index(value) < 0
        except TypeError:
            raise TypeError(f"{name} must be an int >= 0, got {type(value).__name__} {value!r}") from None
        if negative:
            _fail(f"{name} must be >= 0, got {value}")
    if content_checks_enabled(check_inputs, cu_seqlens_q, cu_seqlens_k):
        return check_varlen_contents(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q, max_seqlen_k,
                                     keys_name)  # fmt: skip
    return None


def check_kvcache(q, k_cache, cache_seqlens, check_inputs: bool) -> None:
    """flash_attn_with_kvcache's ``cache_seqlens`` (None: every row holds ``S_cache`` tokens)."""
    if cache_seqlens is None:
        return
    check_int_vector(cache_seqlens, "cache_seqlens", q.shape[0], q.device)
    if content_checks_enabled(check_inputs, cache_seqlens):
        check_cache_seqlens_contents(cache_seqlens, k_cache.shape[1])


def check_paged(q, k_pages, v_pages, page_table, seqlens_k, check_inputs: bool) -> None:
    """flash_attn_paged_decode's pools and tables (q/k/v as :func:`check_qkv` sees them; v_pages may have a
    head dim of its own, ``D_v``)."""
    for name, t in (("k_pages", k_pages), ("v_pages", v_pages), ("q", q)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if k_pages.dim() != 4 or v_pages.dim() != 4 or k_pages.shape[:-1] != v_pages.shape[:-1]:
        _fail(f"k_pages must be (num_pages, page_size, H_kv, D) and v_pages (num_pages, page_size, H_kv, D_v), got "
              f"{tuple(k_pages.shape)} and {tuple(v_pages.shape)}")  # fmt: skip
    if k_pages.shape[0] == 0 or k_pages.shape[1] == 0:
        _fail(f"k_pages/v_pages must hold at least one page of at least one token, got {tuple(k_pages.shape)}")
    if q.dim() != 4:
        _fail(f"q must be 4-D (batch, seqlen, heads, head_dim), got shape {tuple(q.shape)}")
    # The pools' own names and shapes in the errors (check_qkv below sees page 0 as a (B, page_size, H_kv, D) k).
    pools = f"q {tuple(q.shape)}, k_pages {tuple(k_pages.shape)}, v_pages {tuple(v_pages.shape)}"
    if k_pages.dtype != q.dtype or v_pages.dtype != q.dtype:
        raise TypeError(f"q, k_pages, v_pages must share a dtype, got {q.dtype}, {k_pages.dtype}, {v_pages.dtype}")
    if k_pages.device != q.device or v_pages.device != q.device:
        _fail(f"q, k_pages, v_pages must be on one device, got {q.device}, {k_pages.device}, {v_pages.device}")
    if k_pages.shape[-1] != q.shape[-1]:
        _fail(f"q and k_pages must have the same head_dim (their last dim), got {pools}")
    check_head_dim(q.shape[-1], f" ({pools})")
    check_head_dim(v_pages.shape[-1], f" (v_pages' head_dim; {pools})")
    if k_pages.shape[2] == 0 or q.shape[2] % k_pages.shape[2] != 0:
        _fail(f"k_pages/v_pages heads (dim 2) must divide q's heads (GQA/MQA), got {pools}")
    one_page = (q.shape[0], -1, -1, -1)  # page 0 as (B, page_size, H_kv, D)
    check_qkv(q, k_pages[None, 0].expand(one_page), v_pages[None, 0].expand(one_page), packed=False)
    batch = q.shape[0]
    if not isinstance(page_table, torch.Tensor):
        raise TypeError(f"page_table must be a torch.Tensor, got {type(page_table).__name__}")
    if page_table.dim() != 2 or page_table.shape[0] != batch:
        _fail(f"page_table must be ({batch}, max_pages), got {tuple(page_table.shape)}")
    if page_table.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"page_table must be int32 or int64, got {page_table.dtype}")
    _check_table_device(page_table, "page_table", q.device)
    check_int_vector(seqlens_k, "seqlens_k", batch, q.device)
    if content_checks_enabled(check_inputs, page_table, seqlens_k):
        check_page_table_contents(page_table, seqlens_k, k_pages.shape[0], k_pages.shape[1])
