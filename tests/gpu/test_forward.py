"""The FlashAttention forward kernel against the fp32 oracle, on a real GPU.

Layout: q ``(B, S_q, H, D)``, k/v ``(B, S_k, H_kv, D)`` (varlen: ``(T, H, D)``). The bound, as in
flash-attn's tests: the kernel's max error against the fp32 oracle must be at most twice that of a
same-precision torch run (scores, softmax and P @ V in the input dtype) plus a small eps. The
allocator is filled with NaN before every kernel call, so an output element the kernel never writes
shows up as NaN.
"""

import dataclasses
import math

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("pycuda")

from hf_flashpatch.kernels import forward as forward_module  # noqa: E402
from hf_flashpatch.kernels.build import device_arch  # noqa: E402
from hf_flashpatch.kernels.forward import attention_forward  # noqa: E402
from hf_flashpatch.kernels.heuristics import HOPPER_SHAPES, forward_tile_shape, mma_tile_shape  # noqa: E402
from hf_flashpatch.reference import attention_reference, varlen_attention_reference, visibility_mask  # noqa: E402

DTYPES = [torch.bfloat16, torch.float16]
SEQLENS = [(1, 1), (113, 203), (239, 1), (1023, 1024), (4224, 4224), (128, 217), (217, 128)]
HEADS = {"mha": (6, 6), "gqa": (6, 2), "mqa": (6, 1)}


@pytest.fixture(autouse=True, params=["shipped", "mma"])
def forward_variant(request, monkeypatch):
    """Every test runs with the shipped tile choice and, on Hopper at the head dims the wgmma body serves,
    once more with the portable mma.sync body forced (the shape passed explicitly, as benchmarks do)."""
    body = request.param
    head_dim = getattr(request.node, "callspec", None) and request.node.callspec.params.get("head_dim")
    arch = device_arch(torch.device("cuda"))
    if body == "mma":
        if arch != "sm_90a" or ((head_dim or 128), False) not in HOPPER_SHAPES:
            pytest.skip(f"the shipped run already takes the mma.sync body for head dim {head_dim or 128} on {arch}")
        monkeypatch.setattr(forward_module, "forward_tile_shape", lambda d, arch="sm_80", has_mask=False, head_dim_v=None: mma_tile_shape(d))
    return body


def test_body_is_the_one_launched(forward_variant, monkeypatch):
    launched = []
    real_get_kernel = forward_module.get_kernel

    def recording_get_kernel(build, entry, *args, **kwargs):
        launched.append((build.source, entry))
        return real_get_kernel(build, entry, *args, **kwargs)

    monkeypatch.setattr(forward_module, "get_kernel", recording_get_kernel)
    q, k, v = _qkv(1, 239, 239, 4, 2, 128, torch.bfloat16)
    out, lse = _run(q, k, v, causal=True)
    _check(out, lse, q, k, v, causal=True)
    shipped = forward_tile_shape(128, device_arch(torch.device("cuda")), has_mask=True)
    expected = "fwd_hopper_ws.cu" if forward_variant == "shipped" and shipped.wgmma else "fwd.cu"
    assert launched and launched[-1][0] == expected, launched


def _poison_allocator(nbytes: int) -> None:
    """Leave NaN-filled blocks in torch's caching allocator so torch.empty inside the op gets them."""
    blocks = [torch.full((max(nbytes // 4, 1),), float("nan"), device="cuda") for _ in range(3)]
    del blocks


def _run(q, k, v, *, causal=False, window=(-1, -1), softcap=None, scale=None, **varlen):
    _poison_allocator(q.numel() * q.element_size())
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return attention_forward(q, k, v, causal=causal, softmax_scale=scale, window_left=left, window_right=right,
                             softcap=softcap, **varlen)  # fmt: skip


def _lowp_attention(q, k, v, *, causal=False, window=(-1, -1), softcap=None, scale=None):
    """Same-precision torch attention (flash-attn's ``upcast=False`` reference): every op in q's dtype."""
    group = q.shape[2] // k.shape[2]
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    qh = q.transpose(1, 2)  # (B, H, S_q, D)
    kh = k.transpose(1, 2).repeat_interleave(group, dim=1)  # (B, H, S_k, D)
    vh = v.transpose(1, 2).repeat_interleave(group, dim=1)  # (B, H, S_k, D)
    scores = torch.matmul(qh, kh.transpose(-1, -2)) * scale  # (B, H, S_q, S_k), q's dtype
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    visible = visibility_mask(q.shape[1], k.shape[1], left, right, device=q.device)  # (S_q, S_k)
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows that see no key: 0
    return torch.matmul(probs, vh).transpose(1, 2)  # (B, S_q, H, D)


def _oracle(q, k, v, *, causal=False, window=(-1, -1), softcap=None, scale=None):
    return attention_reference(q.float(), k.float(), v.float(), causal=causal, window=window, softcap=softcap,
                               softmax_scale=scale)  # fmt: skip


def _check(out, lse, q, k, v, **kw):
    """Kernel vs oracle within 2x the same-precision torch error; LSE close; -inf rows match."""
    out_ref, lse_ref = _oracle(q, k, v, **kw)
    out_lowp = _lowp_attention(q, k, v, **kw)
    assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and lse.dtype == torch.float32
    assert not out.isnan().any(), "unwritten or NaN output elements"
    err = (out.float() - out_ref).abs().max().item()
    err_lowp = (out_lowp.float() - out_ref).abs().max().item()
    assert err <= 2 * err_lowp + 1e-5, f"kernel error {err:.3g} > 2 x same-precision torch error {err_lowp:.3g}"
    unseen = torch.isneginf(lse_ref)
    assert torch.equal(torch.isneginf(lse), unseen), "rows that see no key must have lse = -inf (and only those)"
    torch.testing.assert_close(lse[~unseen], lse_ref[~unseen], atol=1e-3, rtol=1e-3)


def _qkv(batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim, dtype, transposed=False):
    if transposed:  # transformers' layout: (B, H, S, D) storage viewed as (B, S, H, D)
        q = torch.randn(batch, heads, seqlen_q, head_dim, device="cuda", dtype=dtype).transpose(1, 2)
        k = torch.randn(batch, kv_heads, seqlen_k, head_dim, device="cuda", dtype=dtype).transpose(1, 2)
        v = torch.randn(batch, kv_heads, seqlen_k, head_dim, device="cuda", dtype=dtype).transpose(1, 2)
        return q, k, v
    q = torch.randn(batch, seqlen_q, heads, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(batch, seqlen_k, kv_heads, head_dim, device="cuda", dtype=dtype)
    v = torch.randn(batch, seqlen_k, kv_heads, head_dim, device="cuda", dtype=dtype)
    return q, k, v


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", list(HEADS), ids=list(HEADS))
@pytest.mark.parametrize("seqlens", SEQLENS, ids=[f"{a}x{b}" for a, b in SEQLENS])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_forward_matches_oracle(dtype, head_dim, heads, seqlens, causal):
    seqlen_q, seqlen_k = seqlens
    batch = 1 if seqlen_q * seqlen_k > 1 << 20 else 2
    q, k, v = _qkv(batch, seqlen_q, seqlen_k, *HEADS[heads], head_dim, dtype)
    out, lse = _run(q, k, v, causal=causal)
    _check(out, lse, q, k, v, causal=causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", [32, 96, 256])
@pytest.mark.parametrize("seqlens", [(113, 203), (239, 1), (1023, 1024)], ids=["113x203", "239x1", "1023x1024"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_other_head_dims(dtype, head_dim, seqlens, causal):
    q, k, v = _qkv(2, *seqlens, 4, 2, head_dim, dtype)
    out, lse = _run(q, k, v, causal=causal)
    _check(out, lse, q, k, v, causal=causal)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize(
    "window,causal,seqlens",
    [((32, -1), True, (1023, 1024)), ((64, 16), False, (500, 700)), ((0, 0), False, (239, 239)),
     ((-1, 5), False, (300, 200)), ((100, -1), True, (4224, 4224)), ((7, 3), False, (113, 203))],
    ids=["causal-left32", "left64-right16", "diagonal", "right5", "causal-left100-long", "left7-right3"],
)  # fmt: skip
def test_sliding_window(head_dim, window, causal, seqlens):
    q, k, v = _qkv(1, *seqlens, 4, 2, head_dim, torch.bfloat16)
    out, lse = _run(q, k, v, causal=causal, window=window)
    _check(out, lse, q, k, v, causal=causal, window=window)


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_softcap_and_custom_scale(dtype, causal):
    q, k, v = _qkv(2, 239, 513, 8, 4, 128, dtype)
    q = q * 3  # scores well into tanh's curved range
    out, lse = _run(q, k, v, causal=causal, softcap=2.5, scale=0.2)
    _check(out, lse, q, k, v, causal=causal, softcap=2.5, scale=0.2)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_strided_transformers_layout(head_dim, causal):
    q, k, v = _qkv(2, 1023, 1024, 8, 2, head_dim, torch.bfloat16, transposed=True)
    assert not q.is_contiguous()
    out, lse = _run(q, k, v, causal=causal)
    _check(out, lse, q, k, v, causal=causal)


def test_fully_masked_rows_are_zero_with_neg_inf_lse():
    q, k, v = _qkv(1, 300, 40, 4, 4, 64, torch.bfloat16)
    out, lse = _run(q, k, v, causal=True)  # bottom-right: the first 260 queries see no key
    assert torch.count_nonzero(out[:, :260]) == 0
    assert torch.isneginf(lse[:, :, :260]).all() and torch.isfinite(lse[:, :, 260:]).all()
    _check(out, lse, q, k, v, causal=True)


@pytest.mark.parametrize("heads", ["mha", "gqa"])
@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (True, (48, -1))],
                         ids=["full", "causal", "causal-window"])  # fmt: skip
def test_varlen(heads, causal, window):
    seqlens_q = [1, 113, 0, 239, 700, 64]
    seqlens_k = [1, 203, 5, 239, 700, 300]
    n_heads, n_kv = HEADS[heads]
    cu_q = torch.tensor([0] + seqlens_q, device="cuda").cumsum(0).int()
    cu_k = torch.tensor([0] + seqlens_k, device="cuda").cumsum(0).int()
    q = torch.randn(sum(seqlens_q), n_heads, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(seqlens_k), n_kv, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(sum(seqlens_k), n_kv, 128, device="cuda", dtype=torch.bfloat16)
    out, lse = _run(q, k, v, causal=causal, window=window, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                    max_seqlen_q=max(seqlens_q), max_seqlen_k=max(seqlens_k))  # fmt: skip
    assert out.shape == q.shape and lse.shape == (n_heads, q.shape[0])
    out_ref, lse_ref = varlen_attention_reference(q.float(), k.float(), v.float(), cu_q, cu_k, causal=causal,
                                                  window=window)  # fmt: skip
    # same-precision error, sequence by sequence
    err_lowp = 0.0
    for i in range(len(seqlens_q)):
        q0, q1, k0, k1 = cu_q[i].item(), cu_q[i + 1].item(), cu_k[i].item(), cu_k[i + 1].item()
        if q1 > q0:
            o = _lowp_attention(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], causal=causal, window=window)[0]
            err_lowp = max(err_lowp, (o.float() - out_ref[q0:q1]).abs().max().item())
    assert not out.isnan().any()
    err = (out.float() - out_ref).abs().max().item()
    assert err <= 2 * err_lowp + 1e-5, f"varlen error {err:.3g} > 2 x {err_lowp:.3g}"
    unseen = torch.isneginf(lse_ref)
    assert torch.equal(torch.isneginf(lse), unseen)
    torch.testing.assert_close(lse[~unseen], lse_ref[~unseen], atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_keys_of_other_sequences_never_leak(head_dim, causal):
    """A key tile that runs past its sequence's end holds zeros, not the next sequence's keys: NaN in one
    sequence's K/V (and in rows past the last sequence) leaves every other sequence's output exact. The
    warp-specialised body streams whole tiles with the TMA, so that tile is the one it copies itself."""
    seqlens = [113, 239, 70, 1023]
    cu = torch.tensor([0] + seqlens, device="cuda").cumsum(0).int()
    total = sum(seqlens)
    q = torch.randn(total, 4, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(total + 50, 2, head_dim, device="cuda", dtype=torch.bfloat16)  # 50 rows past the last sequence
    v = torch.randn(total + 50, 2, head_dim, device="cuda", dtype=torch.bfloat16)
    poisoned = slice(cu[1].item(), cu[2].item())  # the second sequence
    for t in (k, v):
        t[poisoned] = float("nan")
        t[total:] = float("nan")
    out, lse = _run(q, k, v, causal=causal, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(seqlens),
                    max_seqlen_k=max(seqlens))  # fmt: skip
    for i in (0, 2, 3):
        s0, s1 = cu[i].item(), cu[i + 1].item()
        alone, alone_lse = _run(q[None, s0:s1], k[None, s0:s1], v[None, s0:s1], causal=causal)
        assert torch.isfinite(out[s0:s1]).all(), f"sequence {i} read another sequence's NaN keys"
        torch.testing.assert_close(out[s0:s1], alone[0], atol=0, rtol=0)  # the batched run of the sequence alone
        torch.testing.assert_close(lse[:, s0:s1], alone_lse[0], atol=0, rtol=0)
    assert out[poisoned].isnan().all()


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_many_sequences_each_as_alone(head_dim, causal):
    """Forty sequences of awkward lengths, GQA: hundreds of work tiles, many of them empty (short sequences
    under the longest one's grid), several per CTA wherever the CTAs are fewer. Every sequence's rows equal
    its batched run alone, bit for bit, and that run matches the oracle."""
    gen = torch.Generator().manual_seed(1)
    seqlens = torch.randint(1, 300, (40,), generator=gen).tolist()
    cu = torch.tensor([0] + seqlens, device="cuda").cumsum(0).int()
    total = sum(seqlens)
    q = torch.randn(total, 8, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(total, 2, head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(total, 2, head_dim, device="cuda", dtype=torch.bfloat16)
    out, lse = _run(q, k, v, causal=causal, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(seqlens),
                    max_seqlen_k=max(seqlens))  # fmt: skip
    for i, seqlen in enumerate(seqlens):
        s0, s1 = cu[i].item(), cu[i + 1].item()
        alone, alone_lse = _run(q[None, s0:s1], k[None, s0:s1], v[None, s0:s1], causal=causal)
        torch.testing.assert_close(out[s0:s1], alone[0], atol=0, rtol=0, msg=f"sequence {i} ({seqlen} tokens)")
        torch.testing.assert_close(lse[:, s0:s1], alone_lse[0], atol=0, rtol=0)
        if seqlen == max(seqlens):
            _check(alone, alone_lse, q[None, s0:s1], k[None, s0:s1], v[None, s0:s1], causal=causal)


@pytest.mark.parametrize("dims", [(128, 128), (64, 64), (192, 128)], ids=["d128", "d64", "d192-128"])
@pytest.mark.parametrize("window", [(-1, 0), (300, 0), (200, 37)], ids=["causal", "window300", "window200-37"])
def test_persistent_masked_walks_match_one_cta_per_tile(forward_variant, dims, window):
    """The persistent masked walk (sectioned work order, odd rounds reversed: heuristics.hopper_forward_schedule)
    against one CTA per work tile: every grid size and section (the last one partial, the last round partial) gives
    the same bits, and the one-CTA-per-tile run matches the oracle. GQA, 1050 positions: hundreds of work tiles."""
    from hf_flashpatch.kernels.heuristics import HopperSchedule, forward_tile_shape

    if forward_variant != "shipped" or not forward_tile_shape(dims[0], device_arch(torch.device("cuda")), True,
                                                              dims[1]).wgmma:  # fmt: skip
        pytest.skip("the walk is the Hopper body's")
    torch.manual_seed(7)
    (d, d_v), (left, right) = dims, window
    q = torch.randn(3, 1050, 8, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(3, 1050, 2, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(3, 1050, 2, d_v, device="cuda", dtype=torch.bfloat16)
    shape = forward_tile_shape(d, "sm_90a", True, d_v)
    tiles = math.ceil(1050 * 4 / shape.block_m) * 2 * 3
    launch = lambda schedule: forward_module._launch(q, k, v, None, None, None, None, None, False, left, right, None,
                                                     schedule=schedule)  # noqa: E731 fmt: skip
    ref_out, ref_lse = launch(HopperSchedule(tiles))
    want, want_lse = attention_reference(q.float(), k.float(), v.float(), window=window)
    assert (ref_out.float() - want).abs().max().item() < 2e-2
    torch.testing.assert_close(ref_lse, want_lse, atol=1e-3, rtol=1e-3)
    for ctas, section in [(132, 1), (132, 2), (100, 4), (77, 5), (tiles // 2 + 1, 3), (131, 6)]:
        out, lse = launch(HopperSchedule(ctas, section))
        assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse), (ctas, section)


@pytest.mark.parametrize("dims", [(128, 128), (64, 64), (192, 128)], ids=["d128", "d64", "d192-128"])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (6, 2)], ids=["g1", "g4", "g3"])
@pytest.mark.parametrize("window", [(-1, 0), (200, 37)], ids=["causal", "window200-37"])
def test_leading_rows_change_no_bit(forward_variant, dims, heads, window):
    """A masked batched walk starts a sequence's first query tile heuristics.leading_rows before it (the rows before
    the sequence computed by no warpgroup, or discarded); a varlen batch starts each sequence's tiles at its first
    row. Lengths whose last tile is short by none, one or two 64-row warpgroups: every batch row equals its sequence
    in the varlen batch (a store to a row before the second sequence would land in the first's), and the run matches
    the oracle. Bit for bit where each row sees the same key tiles either way: without a window's lower bound, and
    where a warpgroup computes only its own rows' key tiles (own_key_tiles). Else a tile's key range follows its first
    and last row, so a row may also see a key tile wholly below its window; that tile moves no maximum, but the online
    softmax's correction exp2(fma(max, scale, -max * scale)) carries the product's rounding error, so the row's sum
    may move by an fp32 ulp (cuda/fwd_softmax.cuh; the exact form cost d64 causal 3-6 %: notes/forward.md)."""
    from hf_flashpatch.kernels.heuristics import leading_rows

    shape = forward_tile_shape(dims[0], device_arch(torch.device("cuda")), True, dims[1])
    if forward_variant != "shipped" or not shape.wgmma:
        pytest.skip("the walk is the Hopper body's")
    torch.manual_seed(11)
    (d, d_v), (h, h_kv) = dims, heads
    group = h // h_kv
    seqlens = [1, 50, 100, 130, 170, 260, 383, 700]
    leads = {leading_rows(s * group, shape.block_m) for s in seqlens}
    assert leads == set(range(0, shape.block_m, 64)), leads  # every lead the tile allows
    for seqlen in seqlens:
        q = torch.randn(2, seqlen, h, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(2, seqlen, h_kv, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(2, seqlen, h_kv, d_v, device="cuda", dtype=torch.bfloat16)
        out, lse = _run(q, k, v, window=window)
        cu = torch.tensor([0, seqlen, 2 * seqlen], device="cuda", dtype=torch.int32)
        packed, packed_lse = _run(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), window=window, cu_seqlens_q=cu,
                                  cu_seqlens_k=cu, max_seqlen_q=seqlen, max_seqlen_k=seqlen)  # (2 S, H, D_v) fmt: skip
        batch_lse = lse.transpose(0, 1).flatten(1, 2)  # (B, H, S) -> (H, B S)
        if window[0] < 0 or shape.own_key_tiles:
            assert torch.equal(out.flatten(0, 1), packed), seqlen
            assert torch.equal(batch_lse, packed_lse), seqlen
        else:  # an fp32 ulp or two of the sum: the LSE's, and at most one bf16 ulp of the output
            torch.testing.assert_close(batch_lse, packed_lse, rtol=2e-6, atol=0, msg=f"{seqlen}")
            torch.testing.assert_close(out.flatten(0, 1), packed, rtol=2**-7, atol=1e-6, msg=f"{seqlen}")
        want, want_lse = attention_reference(q.float(), k.float(), v.float(), window=window)
        assert (out.float() - want).abs().max().item() < 2e-2, seqlen
        seen = ~torch.isneginf(want_lse)
        torch.testing.assert_close(lse[seen], want_lse[seen], atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("dims", [(128, 128), (64, 64), (192, 128)], ids=["d128", "d64", "d192-128"])
@pytest.mark.parametrize("heads", [(4, 4), (8, 4), (8, 2), (16, 2), (6, 2)], ids=["g1", "g2", "g4", "g8", "g3"])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (200, 37)], ids=["full", "causal", "window200-37"])
def test_query_rows_by_the_tma_equal_the_math_warps_copy(forward_variant, monkeypatch, dims, heads, window):
    """With q_by_tma (the d64 shape's; forced here at every head dim the kernel serves), the Hopper body's producer
    loads each math warpgroup's 64 packed query rows by the TMA (a box of group heads x 64 / group positions) when
    the group divides 64; the math warps copy them otherwise. Both give the same bits, batched and varlen (whose
    boxes run into the next sequence's rows), and match the oracle; a group of 3 takes the copy."""
    if forward_variant != "shipped" or not forward_tile_shape(dims[0], device_arch(torch.device("cuda")), True,
                                                              dims[1]).wgmma:  # fmt: skip
        pytest.skip("the Hopper body's Q load")
    torch.manual_seed(3)
    (d, d_v), (n_heads, n_kv), (left, right) = dims, heads, window
    group = n_heads // n_kv
    seqlens = [1, 70, 239, 1023, 130]
    cu = torch.tensor([0] + seqlens, device="cuda").cumsum(0).int()
    q = torch.randn(sum(seqlens), n_heads, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(seqlens), n_kv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(sum(seqlens), n_kv, d_v, device="cuda", dtype=torch.bfloat16)
    real_query_map = forward_module._query_map
    heads_per_box = []

    def recording(config, q_, group_):
        found = real_query_map(config, q_, group_)
        heads_per_box.append(found[1])
        return found

    def copied_by_the_math_warps(config, q_, group_):
        return forward_module.tma.NO_DESCRIPTOR, 0

    masked = left >= 0 or right >= 0
    shape = dataclasses.replace(forward_tile_shape(d, "sm_90a", masked, d_v), q_by_tma=True, kv_cluster=1,
                                tma_output=False, chained_walk=False)  # boxes and the chain need Q rows copied

    def launch(varlen):
        if varlen:
            return forward_module._launch(q, k, v, cu, cu, max(seqlens), max(seqlens), None, False, left, right, None,
                                          shape=shape)  # fmt: skip
        return forward_module._launch(q[None, 70:1400], k[None, 70:1400], v[None, 70:1400], None, None, None, None,
                                      None, False, left, right, None, shape=shape)  # fmt: skip

    for varlen in (False, True):
        monkeypatch.setattr(forward_module, "_query_map", recording)
        out, lse = launch(varlen)
        monkeypatch.setattr(forward_module, "_query_map", copied_by_the_math_warps)
        want, want_lse = launch(varlen)
        assert heads_per_box[-1] == (group if 64 % group == 0 else 0), heads_per_box
        assert torch.equal(out, want) and torch.equal(lse, want_lse), (varlen, group)
    ref, ref_lse = attention_reference(q[None, 70:1400].float(), k[None, 70:1400].float(), v[None, 70:1400].float(),
                                       window=window)  # fmt: skip
    batched, batched_lse = launch(False)
    assert (batched.float() - ref).abs().max().item() < 2e-2
    torch.testing.assert_close(batched_lse, ref_lse, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("case", [(2, 2048, 16, 16), (1, 1000, 8, 2), (3, 1000, 6, 1), (2, 300, 4, 4), (2, 250, 4, 4),
                                  (5, 64, 12, 3)],
                         ids=["2k-mha", "gqa4-partial-tile", "mqa-odd-tiles", "mha-odd-tiles", "one-round", "kv3-short"])  # fmt: skip
def test_kv_multicast_clusters_equal_the_plain_walk(forward_variant, monkeypatch, case):
    """The unmasked d128 shape's K/V multicast (clusters of two CTAs sharing every K/V tile: TileShape.kv_cluster,
    heuristics.clustered_schedule) against the same walk without it: the same bits, matching the oracle; it runs
    clustered exactly where each (kv head, sequence) pair has an even number of query tiles (else the plain build),
    and the GPU holds all the walk's CTAs as clusters at once."""
    shape = forward_tile_shape(128, device_arch(torch.device("cuda")), False)
    if forward_variant != "shipped" or shape.kv_cluster == 1:
        pytest.skip("the K/V multicast is the Hopper body's, unmasked d128")
    batch, seqlen, heads, kv_heads = case
    torch.manual_seed(11)
    q = torch.randn(batch, seqlen, heads, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, seqlen, kv_heads, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(batch, seqlen, kv_heads, 128, device="cuda", dtype=torch.bfloat16)
    clusters = []
    real_get_kernel = forward_module.get_kernel

    def recording_get_kernel(build, entry, *args, **kwargs):
        kernel = real_get_kernel(build, entry, *args, **kwargs)
        clusters.append(int(dict(build.defines).get("KV_CLUSTER", 1)))
        return kernel

    monkeypatch.setattr(forward_module, "get_kernel", recording_get_kernel)
    launch = lambda tile_shape: forward_module._launch(q, k, v, None, None, None, None, None, False, -1, -1, None,
                                                       shape=tile_shape)  # noqa: E731 fmt: skip
    out, lse = launch(shape)
    even = math.ceil(seqlen * heads // kv_heads / shape.block_m) % 2 == 0
    assert clusters[-1] == (2 if even else 1), (clusters, even)
    plain, plain_lse = launch(dataclasses.replace(shape, kv_cluster=1))
    assert clusters[-1] == 1
    assert torch.equal(out, plain) and torch.equal(lse, plain_lse)
    _check(out, lse, q, k, v, causal=False)


@pytest.mark.parametrize("case", [(2, 2048, 16, 16), (2, 113, 8, 4), (1, 1, 16, 1), (3, 250, 6, 2), (2, 1023, 32, 2),
                                  (1, 300, 6, 2), (2, 200, 12, 4), (1, 500, 32, 1)],
                         ids=["2k-mha", "g2-partial", "g16-one-row", "g3", "g16-odd", "g3-one-round", "g3-short",
                              "g32"])  # fmt: skip
@pytest.mark.parametrize("dims", [(128, 128), (192, 128)], ids=["d128", "d192-128"])
def test_output_boxes_equal_the_threads_stores(forward_variant, monkeypatch, case, dims):
    """With tma_output (the unmasked d128 and the 192/128 shapes'), each math warp stages its 16 output rows in its Q
    rows and stores them with the TMA (a box of group heads x 16 / group positions) where the problem is batched and
    the group divides 16; else its threads store them. Both give the same bits, match the oracle, and leave no row
    unwritten (the allocator is NaN-filled); varlen problems and groups of 3 or 32 take the threads' stores."""
    d, d_v = dims
    shape = forward_tile_shape(d, device_arch(torch.device("cuda")), False, d_v)
    if forward_variant != "shipped" or not shape.tma_output:
        pytest.skip("the output boxes are the Hopper body's")
    batch, seqlen, heads, kv_heads = case
    group = heads // kv_heads
    torch.manual_seed(12)
    q = torch.randn(batch, seqlen, heads, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, seqlen, kv_heads, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(batch, seqlen, kv_heads, d_v, device="cuda", dtype=torch.bfloat16)
    boxes = []
    real_output_map = forward_module._output_map

    def recording(config, out, group_, varlen):
        found = real_output_map(config, out, group_, varlen)
        boxes.append(found[1])
        return found

    monkeypatch.setattr(forward_module, "_output_map", recording)
    launch = lambda tile_shape: forward_module._launch(q, k, v, None, None, None, None, None, False, -1, -1, None,
                                                       shape=tile_shape)  # noqa: E731 fmt: skip
    out, lse = launch(shape)
    assert boxes[-1] == (group if 16 % group == 0 else 0), (boxes, group)
    stored, stored_lse = launch(dataclasses.replace(shape, tma_output=False, chained_walk=False))
    assert boxes[-1] == 0
    assert torch.equal(out, stored) and torch.equal(lse, stored_lse)
    assert not out.isnan().any(), "unwritten or NaN output elements"
    if d == d_v:
        _check(out, lse, q, k, v, causal=False)
    else:
        ref, ref_lse = attention_reference(q.float(), k.float(), v.float())
        assert (out.float() - ref).abs().max().item() < 2e-2
        torch.testing.assert_close(lse, ref_lse, atol=1e-3, rtol=1e-3)
    cu = torch.arange(batch + 1, device="cuda", dtype=torch.int32) * seqlen
    packed, packed_lse = forward_module._launch(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu, seqlen,
                                                seqlen, None, False, -1, -1, None, shape=shape)  # fmt: skip
    assert boxes[-1] == 0  # varlen: a box could cross into the next sequence
    assert torch.equal(packed, out.flatten(0, 1))


def test_the_device_holds_a_full_grid_of_multicast_clusters(forward_variant):
    """The driver's count of co-resident clusters of the multicast build (kernels/clusters.py) covers one CTA per
    SM, so the persistent walk keeps every SM; a count of 0 would mean the query failed and every call fell back."""
    from hf_flashpatch.kernels.build import get_kernel, sm_count

    shape = forward_tile_shape(128, device_arch(torch.device("cuda")), False)
    if forward_variant != "shipped" or shape.kv_cluster == 1:
        pytest.skip("the K/V multicast is the Hopper body's, unmasked d128")
    config = forward_module.ForwardConfig.for_problem(128, "bf16", False, shape, "sm_90a")
    kernel = get_kernel(config.build("sm_90a"), config.entry, torch.device("cuda"))
    resident = kernel.resident_clusters(shape.kv_cluster, config.threads)
    sms = sm_count(0)
    assert resident * shape.kv_cluster >= sms - sms % shape.kv_cluster, (resident, sms)


def test_broadcast_kv_heads_are_read_from_a_copy():
    """K/V expanded over their heads (stride 0: no tensor map describes it) give the materialised result."""
    q = torch.randn(2, 300, 8, 128, device="cuda", dtype=torch.bfloat16)
    k1 = torch.randn(2, 300, 1, 128, device="cuda", dtype=torch.bfloat16)
    v1 = torch.randn(2, 300, 1, 128, device="cuda", dtype=torch.bfloat16)
    k, v = k1.expand(-1, -1, 2, -1), v1.expand(-1, -1, 2, -1)  # (B, S, 2, D), head stride 0
    assert k.stride(2) == 0
    out, lse = _run(q, k, v, causal=True)
    expected, expected_lse = _run(q, k.contiguous(), v.contiguous(), causal=True)
    torch.testing.assert_close(out, expected, atol=0, rtol=0)
    torch.testing.assert_close(lse, expected_lse, atol=0, rtol=0)
    _check(out, lse, q, k, v, causal=True)


def test_side_stream():
    q, k, v = _qkv(2, 1023, 1024, 8, 2, 128, torch.bfloat16)
    expected, _ = _run(q, k, v, causal=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        q2 = q * 1.0  # produced on the side stream: the kernel must wait for it
        out, _ = _run(q2, k, v, causal=True)
        out = out * 1.0
    torch.cuda.current_stream().wait_stream(side)
    torch.testing.assert_close(out, expected, atol=0, rtol=0)


def test_cuda_graph_capture_and_replay():
    q, k, v = _qkv(2, 513, 513, 8, 2, 64, torch.bfloat16)
    static_q = q.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (compile, load) outside the capture
        _run(static_q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out, static_lse = attention_forward(static_q, k, v, causal=True, softmax_scale=None, window_left=-1,
                                                   window_right=0, softcap=None)  # fmt: skip
    new_q = torch.randn_like(q)
    static_q.copy_(new_q)
    graph.replay()
    torch.cuda.synchronize()
    expected_out, expected_lse = _run(new_q, k, v, causal=True)
    torch.testing.assert_close(static_out, expected_out, atol=0, rtol=0)
    torch.testing.assert_close(static_lse, expected_lse, atol=0, rtol=0)


def test_torch_compile_fullgraph():
    q, k, v = _qkv(2, 239, 300, 8, 2, 128, torch.bfloat16)

    def attend(q, k, v):
        out, lse = attention_forward(q, k, v, causal=True, softmax_scale=None, window_left=-1, window_right=0,
                                     softcap=None)  # fmt: skip
        return out * 2.0, lse

    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
    out, lse = compiled(q, k, v)
    expected_out, expected_lse = _run(q, k, v, causal=True)
    torch.testing.assert_close(out, expected_out * 2.0, atol=0, rtol=0)
    torch.testing.assert_close(lse, expected_lse, atol=0, rtol=0)


def test_unsupported_inputs_raise_kernel_unsupported():
    from hf_flashpatch.errors import KernelUnsupported

    q, k, v = _qkv(1, 16, 16, 2, 2, 64, torch.float32)
    with pytest.raises(KernelUnsupported, match="got torch.float32"):
        _run(q, k, v)
    q, k, v = _qkv(1, 16, 16, 2, 2, 288, torch.bfloat16)  # above 256: no build takes it, padded or not
    with pytest.raises(KernelUnsupported, match=r"head dims up to 256 .*got q \(1, 16, 2, 288\)"):
        _run(q, k, v)
