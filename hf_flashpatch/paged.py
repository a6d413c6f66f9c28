"""A paged KV cache that users manage themselves (FlashInfer-style page pool).

Storage per layer: ``k_pages, v_pages (num_pages, page_size, H_kv, D)``: one head dim for K and V (a V head
dim of its own, as in multi-head latent attention, is refused by name; decoding it over a cache would take
the torch fallback anyway, see :mod:`hf_flashpatch.api`). A sequence owns a list of
pages; logical token ``j`` of a sequence lives in page ``pages[j // page_size]`` at offset
``j % page_size``. The page table handed to the kernel is int32 ``(B, max_pages)``.

A decode step::

    cache = PagedKVCache(num_pages=1024, page_size=16, kv_heads=8, head_dim=128,
                         dtype=torch.bfloat16, device="cuda", num_layers=32)
    cache.allocate(seq_ids, num_tokens=1)               # grow each sequence by one token (all or nothing)
    for layer in range(32):
        cache.append(seq_ids, k_new, v_new, layer)      # k_new (B, 1, H_kv, D): the newest token(s)
        out = cache.decode(q, seq_ids, layer)           # q (B, 1, H, D) -> (B, 1, H, D)
    cache.free(seq_id)                                   # pages back to the pool

``allocate`` reserves the pages for the new tokens and advances each sequence's length once for all
layers; ``append`` writes exactly the tokens allocated since the layer's last append (the last
``S_new`` of each sequence; anything else is an error, never a silent overwrite) with
:func:`hf_flashpatch.kv_append` (the CUDA kernel where it serves, torch elsewhere); ``decode`` calls
:func:`hf_flashpatch.flash_attn_paged_decode` (the cache built the tables, so their contents are not
re-checked) and refuses a sequence with tokens allocated but not yet appended in that layer (it would read
whatever the page held before). ``seq_ids`` is a list of hashable ids, or one id (a tuple such as
``(request, beam)`` is one id), the same for every method. When the pool is short, ``allocate`` raises
:class:`~hf_flashpatch.errors.PagePoolExhausted` before touching anything.
"""

from __future__ import annotations

import operator
from collections.abc import Hashable, Iterable, Sequence

import torch

from .errors import PagePoolExhausted
from .validate import SUPPORTED_DTYPES, check_head_dim, check_page_table_contents


def _as_ids(seq_ids) -> list[Hashable]:
    """A list of sequence ids as it is; anything else hashable (a str, an int, a tuple such as ``(request, beam)``)
    as one id. Other iterables (a range, a set, a tensor, a generator) are refused rather than read as one id by
    one method and as several by another."""
    if isinstance(seq_ids, list):
        for seq_id in seq_ids:
            if not isinstance(seq_id, Hashable):
                raise TypeError(f"a sequence id must be hashable, got {type(seq_id).__name__} {seq_id!r} in seq_ids")
        return seq_ids
    if isinstance(seq_ids, (str, bytes, tuple)) or not isinstance(seq_ids, Iterable):
        if not isinstance(seq_ids, Hashable):
            raise TypeError(f"a sequence id must be hashable, got {type(seq_ids).__name__} {seq_ids!r}")
        return [seq_ids]
    raise TypeError(f"seq_ids must be one id (a str, an int, a tuple, ...) or a list of ids, got "
                    f"{type(seq_ids).__name__} {seq_ids!r}")  # fmt: skip


def _as_int(value, what: str) -> int:
    """``value`` as an int (numpy integers too); bools and non-integers: ValueError "``what``, got ``value``"."""
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{what}, got {value!r}") from None


def check_page_table(page_table: torch.Tensor, num_pages: int, seqlens: torch.Tensor, page_size: int) -> None:
    """ValueError naming the first negative or too long length, or the first page index (among the
    pages each sequence uses) outside ``[0, num_pages)``.

    ``page_table`` int ``(B, max_pages)``, ``seqlens`` int ``(B,)``. The check
    :func:`hf_flashpatch.flash_attn_paged_decode` runs (one device sync on GPU).
    """
    for name, t in (("page_table", page_table), ("seqlens", seqlens)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
    for name, value in (("num_pages", num_pages), ("page_size", page_size)):
        if _as_int(value, f"{name} must be a positive int") <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if page_table.dim() != 2 or seqlens.shape != (page_table.shape[0],):
        raise ValueError(
            f"page_table must be (B, max_pages) and seqlens (B,), got {tuple(page_table.shape)} and "
            f"{tuple(seqlens.shape)}"
        )
    check_page_table_contents(page_table, seqlens, num_pages, page_size, seqlens_name="seqlens")


class PagedKVCache:
    """A pool of ``num_pages`` pages of ``page_size`` tokens, per layer ``(num_pages, page_size, H_kv, D)``."""

    def __init__(
        self,
        num_pages: int,
        page_size: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cpu",
        num_layers: int = 1,
    ):
        sizes = {"num_pages": num_pages, "page_size": page_size, "kv_heads": kv_heads, "head_dim": head_dim,
                 "num_layers": num_layers}  # fmt: skip
        for name, value in sizes.items():
            sizes[name] = _as_int(value, f"{name} must be a positive int")
            if sizes[name] <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        num_pages, page_size, kv_heads, head_dim, num_layers = sizes.values()
        check_head_dim(head_dim)  # what decode accepts, so a cache that cannot decode fails here, not later
        if dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"dtype must be torch.float16, torch.bfloat16 or torch.float32, got {dtype!r}")
        self.num_pages, self.page_size = num_pages, page_size
        self.kv_heads, self.head_dim, self.num_layers = kv_heads, head_dim, num_layers
        shape = (num_layers, num_pages, page_size, kv_heads, head_dim)
        self.k_pages = torch.zeros(shape, dtype=dtype, device=device)  # (L, num_pages, page_size, H_kv, D)
        self.v_pages = torch.zeros(shape, dtype=dtype, device=device)
        self._free: list[int] = list(range(num_pages - 1, -1, -1))  # a stack: lowest page index popped first
        self._pages: dict[Hashable, list[int]] = {}
        self._lengths: dict[Hashable, int] = {}
        # Per layer: tokens of each sequence written so far; append writes exactly the rest.
        self._written: list[dict[Hashable, int]] = [{} for _ in range(num_layers)]

    # ------------------------------------------------------------------------------ bookkeeping

    @property
    def num_free_pages(self) -> int:
        return len(self._free)

    def seq_len(self, seq_id: Hashable) -> int:
        return self._lengths[self._known(seq_id)]

    def pages_of(self, seq_id: Hashable) -> list[int]:
        return list(self._pages[self._known(seq_id)])

    def _known(self, seq_id: Hashable) -> Hashable:
        if seq_id not in self._lengths:
            raise KeyError(f"unknown sequence {seq_id!r} (known: {list(self._lengths)[:8]}...)")
        return seq_id

    def allocate(self, seq_ids: Hashable | Sequence[Hashable], num_tokens: int) -> None:
        """Grow each sequence (new ids start empty) by ``num_tokens`` tokens, taking pages as needed.

        All or nothing: when the pool lacks pages for all of them, raises ``PagePoolExhausted``
        (pages needed vs free) and changes nothing.
        """
        ids = _as_ids(seq_ids)
        num_tokens = _as_int(num_tokens, "num_tokens must be an int >= 0")
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be an int >= 0, got {num_tokens!r}")
        if len(set(ids)) != len(ids):
            raise ValueError(f"seq_ids must be distinct, got {ids}")
        needed = []
        for seq_id in ids:
            length = self._lengths.get(seq_id, 0)
            have = len(self._pages.get(seq_id, ()))
            needed.append(max(0, -(-(length + num_tokens) // self.page_size) - have))
        if sum(needed) > len(self._free):
            raise PagePoolExhausted(
                f"paged KV cache exhausted: {sum(needed)} pages needed for {num_tokens} more tokens in "
                f"{len(ids)} sequence(s), {len(self._free)} free of {self.num_pages}; nothing was allocated"
            )
        for seq_id, count in zip(ids, needed):
            pages = self._pages.setdefault(seq_id, [])
            pages.extend(self._free.pop() for _ in range(count))
            self._lengths[seq_id] = self._lengths.get(seq_id, 0) + num_tokens

    def free(self, seq_id: Hashable) -> None:
        """Return a sequence's pages to the pool (their contents are left as they are)."""
        self._known(seq_id)
        self._free.extend(reversed(self._pages.pop(seq_id)))
        del self._lengths[seq_id]
        for written in self._written:
            written.pop(seq_id, None)

    def page_table(self, seq_ids: Sequence[Hashable]) -> torch.Tensor:
        """int32 ``(B, max_pages)`` on the pool's device; unused entries are 0 (never read)."""
        rows = [self._pages[self._known(s)] for s in _as_ids(seq_ids)]
        width = max(1, max((len(r) for r in rows), default=1))
        table = torch.zeros(len(rows), width, dtype=torch.int32)
        for b, row in enumerate(rows):
            table[b, : len(row)] = torch.tensor(row, dtype=torch.int32)
        return table.to(self.k_pages.device)

    def seqlens(self, seq_ids: Sequence[Hashable]) -> torch.Tensor:
        """int32 ``(B,)`` on the pool's device."""
        lengths = [self._lengths[self._known(s)] for s in _as_ids(seq_ids)]
        return torch.tensor(lengths, dtype=torch.int32, device=self.k_pages.device)

    def slots(self, seq_id: Hashable, start: int, stop: int) -> list[int]:
        """Flat slot (``page * page_size + offset``) of logical tokens ``start..stop-1``."""
        pages, size = self._pages[self._known(seq_id)], self.page_size
        if not 0 <= start <= stop <= self._lengths[seq_id]:
            raise ValueError(f"token range {start}:{stop} outside sequence {seq_id!r} of {self._lengths[seq_id]} tokens")
        return [pages[j // size] * size + j % size for j in range(start, stop)]

    # ------------------------------------------------------------------------------ data

    def _check_layer(self, layer: int) -> int:
        index = _as_int(layer, f"layer must be an int in 0..{self.num_layers - 1}")
        if not 0 <= index < self.num_layers:
            raise ValueError(f"layer must be in 0..{self.num_layers - 1}, got {layer!r}")
        return index

    def append(self, seq_ids: Sequence[Hashable], k_new: torch.Tensor, v_new: torch.Tensor, layer: int = 0) -> None:
        """Write the newest ``S_new`` tokens of each sequence in ``layer``.

        ``k_new, v_new (B, S_new, H_kv, D)``, floating (cast to the pool's dtype as torch casts: a value beyond its
        range becomes inf): row ``b`` holds tokens ``len - S_new .. len - 1`` of
        ``seq_ids[b]`` (call ``allocate(seq_ids, S_new)`` first). ``S_new`` must be the number of
        tokens allocated since this layer's last append to the sequence, and the ids distinct: a
        missing ``allocate`` would otherwise overwrite the last tokens.
        """
        layer = self._check_layer(layer)
        seq_ids = _as_ids(seq_ids)
        if len(set(seq_ids)) != len(seq_ids):
            raise ValueError(f"seq_ids must be distinct, got {seq_ids}")
        for name, t in (("k_new", k_new), ("v_new", v_new)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dtype not in SUPPORTED_DTYPES and t.dtype != torch.float64:  # floats are cast to the pool's dtype
                raise TypeError(f"{name} must be a real floating tensor (cast to the pool's {self.k_pages.dtype}), got "
                                f"{t.dtype}")  # fmt: skip
        expected = (len(seq_ids), k_new.shape[1] if k_new.dim() == 4 else -1, self.kv_heads, self.head_dim)
        if k_new.dim() != 4 or tuple(k_new.shape) != expected or v_new.shape != k_new.shape:
            raise ValueError(
                f"k_new/v_new must be (B={len(seq_ids)}, S_new, H_kv={self.kv_heads}, D={self.head_dim}) (this pool "
                f"keeps one head dim for K and V: no value head dim of its own), got {tuple(k_new.shape)} and "
                f"{tuple(v_new.shape)}"
            )
        new = k_new.shape[1]
        written = self._written[layer]
        slots: list[int] = []
        for seq_id in seq_ids:
            length = self.seq_len(seq_id)
            pending = length - written.get(seq_id, 0)
            if pending != new:
                raise ValueError(
                    f"sequence {seq_id!r} has {pending} token(s) allocated and not yet written in layer {layer}, "
                    f"but append got S_new = {new} (k_new {tuple(k_new.shape)}); call allocate(seq_ids, S_new) "
                    f"once before the appends of each step"
                )
            slots += self.slots(seq_id, length - new, length)
        if not slots:
            return  # no sequences or no tokens: nothing to write
        device = self.k_pages.device
        index = torch.tensor(slots, dtype=torch.int64, device=device)  # (B * S_new,)
        flat = (self.num_pages * self.page_size, self.kv_heads, self.head_dim)
        k_pool, v_pool = self.k_pages[layer].view(flat), self.v_pages[layer].view(flat)  # (slots, H_kv, D)
        k_rows = k_new.to(device=device, dtype=k_pool.dtype).reshape(-1, self.kv_heads, self.head_dim)  # (B*S_new, H_kv, D)
        v_rows = v_new.to(device=device, dtype=v_pool.dtype).reshape(-1, self.kv_heads, self.head_dim)
        from .api import kv_append  # the public door: the kernel where it serves, else torch

        kv_append(k_rows, v_rows, k_pool, v_pool, index, check_inputs=False)  # slots come from this pool's table
        written.update((seq_id, self._lengths[seq_id]) for seq_id in seq_ids)

    def decode(self, q: torch.Tensor, seq_ids: Sequence[Hashable], layer: int = 0, **kwargs):
        """Attention of ``q (B, S_q, H, D)`` (the last ``S_q`` tokens of each sequence) over the cache
        of ``layer``; kwargs as :func:`hf_flashpatch.flash_attn_paged_decode` (``causal=True`` default)."""
        from .api import flash_attn_paged_decode

        layer = self._check_layer(layer)
        seq_ids = _as_ids(seq_ids)
        if not isinstance(q, torch.Tensor) or q.dim() != 4 or q.shape[0] != len(seq_ids):
            raise ValueError(f"q must be (B={len(seq_ids)}, S_q, H, D), one row per sequence, got "
                             f"{tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__}")  # fmt: skip
        written = self._written[layer]
        for seq_id in seq_ids:
            missing = self.seq_len(seq_id) - written.get(seq_id, 0)
            if missing:
                raise ValueError(
                    f"sequence {seq_id!r} has {missing} token(s) allocated but not yet appended in layer {layer}: "
                    f"decode would read keys and values that were never written; call append first"
                )
        kwargs.setdefault("check_inputs", False)  # the tables come from this cache's own bookkeeping
        return flash_attn_paged_decode(
            q, self.k_pages[layer], self.v_pages[layer], self.page_table(seq_ids), self.seqlens(seq_ids), **kwargs
        )

    def gather(self, seq_id: Hashable, layer: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Un-page one sequence: ``(k, v)`` each ``(seq_len, H_kv, D)`` (a copy, for inspection/tests)."""
        layer = self._check_layer(layer)
        index = torch.tensor(self.slots(seq_id, 0, self.seq_len(seq_id)), dtype=torch.int64, device=self.k_pages.device)
        flat = (self.num_pages * self.page_size, self.kv_heads, self.head_dim)
        return self.k_pages[layer].view(flat)[index], self.v_pages[layer].view(flat)[index]
