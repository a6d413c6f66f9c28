"""The chained walk's split last round (``TileShape.split_tail``, ``cuda/fwd_split_tail.cuh``) on a real GPU.

Where an unmasked walk's works do not fill its last round, that round's works are cut by key tiles over the whole
grid and each work's parts meet in fp32. The works of the full rounds must keep the bits of the chain without the
split, the split works must match them to within the parts' rounding and the fp32 oracle within twice a
same-precision torch run, every output element must be written (NaN-filled allocator), and two runs must give the same
bits (the parts fold in part order, whichever comes last). Layout: q ``(B, S_q, H, D)``, k/v ``(B, S_k, H_kv, D)``.
"""

import dataclasses

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("pycuda")

from hf_flashpatch.kernels import forward as forward_module  # noqa: E402
from hf_flashpatch.kernels.build import device_arch, sm_count  # noqa: E402
from hf_flashpatch.kernels import heuristics  # noqa: E402
from hf_flashpatch.kernels.heuristics import HOPPER_SHAPES  # noqa: E402

from .forward_checks import check_against_oracle, poison_allocator, random_qkv  # noqa: E402

if device_arch(torch.device("cuda")) != "sm_90a":
    pytest.skip("the chained walk is the Hopper body's", allow_module_level=True)

SPLIT = HOPPER_SHAPES[(128, False)]
if not SPLIT.split_tail:
    pytest.skip("the unmasked d128 shape does not split its last round", allow_module_level=True)
UNSPLIT = dataclasses.replace(SPLIT, split_tail=False)


def _launch(q, k, v, shape, monkeypatch):
    """The kernel with ``shape``, splitting every partial last round at any key count (the shipped range and threshold,
    heuristics.SPLIT_CHAIN_KEYS and SPLIT_TAIL_MIN_SAVED_TILES, are speed choices); returns (out, lse, what the
    launch chose)."""
    monkeypatch.setattr(heuristics, "SPLIT_TAIL_MIN_SAVED_TILES", 0)
    monkeypatch.setattr(heuristics, "SPLIT_CHAIN_KEYS", (1, 8192))
    seen = {}
    real_split_tail = forward_module._split_tail

    def recording_split_tail(config, ctas, *args):
        partials, counters, tail_parts = real_split_tail(config, ctas, *args)
        seen.update(tail_parts=tail_parts, ctas=ctas, chained=config.chained_walk)
        return partials, counters, tail_parts

    monkeypatch.setattr(forward_module, "_split_tail", recording_split_tail)
    poison_allocator(q.numel() * q.element_size())
    out, lse = forward_module._launch(q, k, v, None, None, None, None, None, False, -1, -1, None, shape=shape)
    return out, lse, seen


def _tail_rows(batch, seqlen_q, heads, kv_heads, ctas):
    """(B, S_q, H) True where the row belongs to a work of the walk's last round (persistent_work, pair-major, a
    pair's query tiles last first)."""
    group = heads // kv_heads
    count = -(-seqlen_q * group // 128)
    works = count * kv_heads * batch
    mask = torch.zeros(batch, seqlen_q, heads, dtype=torch.bool)
    for w in range(works // ctas * ctas, works):
        pair, m_rev = divmod(w, count)
        batch_index, kv_head = divmod(pair, kv_heads)
        packed = torch.arange((count - 1 - m_rev) * 128, min((count - m_rev) * 128, seqlen_q * group))
        mask[batch_index, packed // group, kv_head * group + packed % group] = True
    return mask.cuda()


# (batch, seqlen_q, seqlen_k, heads, kv_heads): 16k tokens at 2k (2048 works), GQA with a partial last key tile,
# pairs of odd query tiles (no cluster), more keys than queries, one key tile a work (whole pieces), 8k keys.
CASES = {
    "8x2k-mha": (8, 2048, 2048, 16, 16),
    "g16-1023": (3, 1023, 1023, 32, 2),
    "odd-tiles": (1, 1100, 1100, 16, 16),
    "q300-k1000": (6, 300, 1000, 8, 8),
    "one-key-tile": (10, 160, 160, 8, 8),
    "1x8k": (1, 8192, 8192, 3, 3),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_split_last_round_keeps_full_rounds_bits_and_the_oracle(monkeypatch, case, dtype):
    batch, seqlen_q, seqlen_k, heads, kv_heads = case
    torch.manual_seed(31)
    q, k, v = random_qkv(batch, seqlen_q, seqlen_k, heads, kv_heads, 128, dtype)
    out, lse, seen = _launch(q, k, v, SPLIT, monkeypatch)
    assert seen["chained"], seen
    works = -(-seqlen_q * (heads // kv_heads) // 128) * kv_heads * batch
    if works % sm_count(0) and works > sm_count(0):
        assert seen["tail_parts"] > 0, seen
    plain, plain_lse, plain_seen = _launch(q, k, v, UNSPLIT, monkeypatch)
    assert plain_seen["tail_parts"] == 0 and plain_seen["ctas"] == seen["ctas"]
    tail = _tail_rows(batch, seqlen_q, heads, kv_heads, seen["ctas"])
    assert not out.isnan().any(), "unwritten or NaN output elements"
    assert torch.equal(out[~tail], plain[~tail]), "a work of the full rounds changed its bits"
    lse_tail = tail.permute(0, 2, 1)  # (B, H, S_q) as lse
    assert torch.equal(lse[~lse_tail], plain_lse[~lse_tail])
    if seen["tail_parts"]:
        assert tail.any()
        assert (out[tail].float() - plain[tail].float()).abs().max().item() <= 4e-3
        torch.testing.assert_close(lse[lse_tail], plain_lse[lse_tail], atol=2e-5, rtol=1e-6)
    check_against_oracle(out, lse, q, k, v)
    again, again_lse, _ = _launch(q, k, v, SPLIT, monkeypatch)
    assert torch.equal(again, out) and torch.equal(again_lse, lse), "the split round is not deterministic"
