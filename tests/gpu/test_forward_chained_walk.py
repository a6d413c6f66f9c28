"""The chained walk of the Hopper forward (``TileShape.chained_walk``, ``cuda/fwd_hopper_chain.cuh``) on a real GPU.

One key loop over all of a math warpgroup's works: it must give the same bits as the same tiles walked work by work,
match the fp32 oracle, write every output element (the allocator is NaN-filled), and fall back to the work-by-work
walk where it cannot store by boxes (varlen, a group that does not divide 16) or a work sees no key.
Layout: q ``(B, S_q, H, D)``, k/v ``(B, S_k, H_kv, D)``.
"""

import dataclasses

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("pycuda")

from hf_flashpatch.kernels import forward as forward_module  # noqa: E402
from hf_flashpatch.kernels.build import device_arch  # noqa: E402
from hf_flashpatch.kernels.heuristics import CHAINED_WALK_MAX_KEYS, HOPPER_SHAPES  # noqa: E402
from hf_flashpatch.reference import attention_reference  # noqa: E402

from .forward_checks import poison_allocator  # noqa: E402

if device_arch(torch.device("cuda")) != "sm_90a":
    pytest.skip("the chained walk is the Hopper body's", allow_module_level=True)

CHAINED = HOPPER_SHAPES[(128, False)]
if not CHAINED.chained_walk:
    pytest.skip("the unmasked d128 shape does not chain", allow_module_level=True)
# The chain without its split last round: every work's bits are the work-by-work walk's (the split round's parts meet
# in fp32: test_forward_split_tail.py).
CHAINED_UNSPLIT = dataclasses.replace(CHAINED, split_tail=False)


def _launch(q, k, v, shape, launched, monkeypatch):
    """The kernel with ``shape``; appends whether the chained build ran to ``launched``."""
    real_get_kernel = forward_module.get_kernel

    def recording_get_kernel(build, entry, *args, **kwargs):
        launched.append(dict(build.defines).get("CHAINED_WALK") == "1")
        return real_get_kernel(build, entry, *args, **kwargs)

    monkeypatch.setattr(forward_module, "get_kernel", recording_get_kernel)
    poison_allocator(q.numel() * q.element_size())
    return forward_module._launch(q, k, v, None, None, None, None, None, False, -1, -1, None, shape=shape)


# (batch, seqlen_q, seqlen_k, heads, kv_heads): many works a CTA, one key tile, a key tile of one key, partial query
# tiles, GQA groups that divide 16 (boxes) and one that does not (3: the work-by-work walk), more keys than queries,
# more query tiles a pair than CTAs (a round of the walk within one pair).
CASES = {
    "8x2k-mha": (8, 2048, 2048, 16, 16),
    "gqa4-partial": (1, 1000, 1000, 8, 2),
    "g2-113": (2, 113, 113, 8, 4),
    "g16-one-row": (1, 1, 1, 16, 1),
    "one-key-tile": (2, 160, 160, 4, 4),
    "last-tile-one-key": (4, 161, 161, 4, 4),
    "g16-1023": (2, 1023, 1023, 32, 2),
    "q300-k1000": (3, 300, 1000, 8, 8),
    "g3-no-boxes": (2, 250, 250, 6, 2),
    "g16-256-tiles": (2, 2048, 2048, 16, 1),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_chained_walk_equals_the_work_by_work_walk(monkeypatch, case, dtype):
    batch, seqlen_q, seqlen_k, heads, kv_heads = case
    group = heads // kv_heads
    torch.manual_seed(21)
    q = torch.randn(batch, seqlen_q, heads, 128, device="cuda", dtype=dtype)
    k = torch.randn(batch, seqlen_k, kv_heads, 128, device="cuda", dtype=dtype)
    v = torch.randn(batch, seqlen_k, kv_heads, 128, device="cuda", dtype=dtype)
    launched = []
    out, lse = _launch(q, k, v, CHAINED_UNSPLIT, launched, monkeypatch)
    assert launched[-1] == (16 % group == 0), (launched, group)
    plain, plain_lse = _launch(q, k, v, dataclasses.replace(CHAINED_UNSPLIT, chained_walk=False), launched, monkeypatch)
    assert not launched[-1]
    assert not out.isnan().any(), "unwritten or NaN output elements"
    assert torch.equal(out, plain) and torch.equal(lse, plain_lse)
    ref, ref_lse = attention_reference(q.float(), k.float(), v.float())
    assert (out.float() - ref).abs().max().item() < 2e-2
    torch.testing.assert_close(lse, ref_lse, atol=1e-3, rtol=1e-3)


def test_chained_walk_falls_back_for_varlen_long_keys_and_no_keys(monkeypatch):
    """Varlen (no output boxes), more keys than CHAINED_WALK_MAX_KEYS and a problem without keys take the work-by-work
    walk: varlen gives each sequence's batched bits, and zero keys give zeros with LSE -inf."""
    torch.manual_seed(22)
    batch, seqlen, heads = 3, 500, 8
    q = torch.randn(batch, seqlen, heads, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, seqlen, heads, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(batch, seqlen, heads, 128, device="cuda", dtype=torch.bfloat16)
    launched = []
    out, _ = _launch(q, k, v, CHAINED, launched, monkeypatch)
    assert launched[-1]
    cu = torch.arange(batch + 1, device="cuda", dtype=torch.int32) * seqlen
    packed, _ = forward_module._launch(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu, seqlen, seqlen,
                                       None, False, -1, -1, None, shape=CHAINED)  # fmt: skip
    assert not launched[-1]
    assert torch.equal(packed, out.flatten(0, 1))
    long_keys = torch.randn(1, CHAINED_WALK_MAX_KEYS + 1, heads, 128, device="cuda", dtype=torch.bfloat16)
    _launch(q[:1], long_keys, long_keys, CHAINED, launched, monkeypatch)
    assert not launched[-1]
    empty = torch.empty(batch, 0, heads, 128, device="cuda", dtype=torch.bfloat16)
    none_out, none_lse = _launch(q, empty, empty, CHAINED, launched, monkeypatch)
    assert torch.equal(none_out, torch.zeros_like(none_out)) and torch.isneginf(none_lse).all()


def test_chained_walk_reads_q_views_as_their_copies(monkeypatch):
    """The chain loads the next work's Q through q's own strides: q, k and v as views of one fused projection (row
    stride 3 H D, as models with a fused qkv give them) run the chained walk with the bits of contiguous copies, and so
    does a q whose heads broadcast one head (stride 0: the chain where the driver maps it, else work by work)."""
    torch.manual_seed(23)
    batch, seqlen, heads = 3, 1000, 8
    qkv = torch.randn(batch, seqlen, 3 * heads, 128, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.split(heads, dim=2)  # each (B, S, H, D), row stride 3 H D
    launched = []
    out, lse = _launch(q, k, v, CHAINED, launched, monkeypatch)
    assert launched[-1]
    dense, dense_lse = _launch(q.contiguous(), k.contiguous(), v.contiguous(), CHAINED, launched, monkeypatch)
    assert not out.isnan().any() and torch.equal(out, dense) and torch.equal(lse, dense_lse)
    broadcast = q[:, :, :1].expand(batch, seqlen, heads, 128)  # every head is head 0
    out, lse = _launch(broadcast, k, v, CHAINED_UNSPLIT, launched, monkeypatch)  # work by work if unmapped: no split
    dense, dense_lse = _launch(broadcast.contiguous(), k, v, CHAINED_UNSPLIT, launched, monkeypatch)
    assert not out.isnan().any() and torch.equal(out, dense) and torch.equal(lse, dense_lse)
    ref, _ = attention_reference(broadcast.float(), k.float(), v.float())
    assert (out.float() - ref).abs().max().item() < 2e-2
