"""The FlashAttention forward kernel against the fp32 oracle, on a real GPU: dtypes, head dims, awkward lengths,
MHA/GQA/MQA, masks, softcap, varlen, streams, graphs, compile and refusals. Each runs with the shipped tile choice and
with the portable mma.sync body forced. The Hopper walks' own equalities: ``test_forward_walks.py``.

Layout: q ``(B, S_q, H, D)``, k/v ``(B, S_k, H_kv, D)`` (varlen: ``(T, H, D)``). The bound (``forward_checks``):
twice the error of a same-precision torch run against the fp32 oracle; the allocator is NaN-filled before each call.
"""


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
from hf_flashpatch.reference import varlen_attention_reference  # noqa: E402

from .forward_checks import check_against_oracle, lowp_attention, random_qkv, run_forward  # noqa: E402

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
    q, k, v = random_qkv(1, 239, 239, 4, 2, 128, torch.bfloat16)
    out, lse = run_forward(q, k, v, causal=True)
    check_against_oracle(out, lse, q, k, v, causal=True)
    shipped = forward_tile_shape(128, device_arch(torch.device("cuda")), has_mask=True)
    expected = "fwd_hopper_ws.cu" if forward_variant == "shipped" and shipped.wgmma else "fwd.cu"
    assert launched and launched[-1][0] == expected, launched


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", list(HEADS), ids=list(HEADS))
@pytest.mark.parametrize("seqlens", SEQLENS, ids=[f"{a}x{b}" for a, b in SEQLENS])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_forward_matches_oracle(dtype, head_dim, heads, seqlens, causal):
    seqlen_q, seqlen_k = seqlens
    batch = 1 if seqlen_q * seqlen_k > 1 << 20 else 2
    q, k, v = random_qkv(batch, seqlen_q, seqlen_k, *HEADS[heads], head_dim, dtype)
    out, lse = run_forward(q, k, v, causal=causal)
    check_against_oracle(out, lse, q, k, v, causal=causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", [32, 96, 256])
@pytest.mark.parametrize("seqlens", [(113, 203), (239, 1), (1023, 1024)], ids=["113x203", "239x1", "1023x1024"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_other_head_dims(dtype, head_dim, seqlens, causal):
    q, k, v = random_qkv(2, *seqlens, 4, 2, head_dim, dtype)
    out, lse = run_forward(q, k, v, causal=causal)
    check_against_oracle(out, lse, q, k, v, causal=causal)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize(
    "window,causal,seqlens",
    [((32, -1), True, (1023, 1024)), ((64, 16), False, (500, 700)), ((0, 0), False, (239, 239)),
     ((-1, 5), False, (300, 200)), ((100, -1), True, (4224, 4224)), ((7, 3), False, (113, 203))],
    ids=["causal-left32", "left64-right16", "diagonal", "right5", "causal-left100-long", "left7-right3"],
)  # fmt: skip
def test_sliding_window(head_dim, window, causal, seqlens):
    q, k, v = random_qkv(1, *seqlens, 4, 2, head_dim, torch.bfloat16)
    out, lse = run_forward(q, k, v, causal=causal, window=window)
    check_against_oracle(out, lse, q, k, v, causal=causal, window=window)


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_softcap_and_custom_scale(dtype, causal):
    q, k, v = random_qkv(2, 239, 513, 8, 4, 128, dtype)
    q = q * 3  # scores well into tanh's curved range
    out, lse = run_forward(q, k, v, causal=causal, softcap=2.5, scale=0.2)
    check_against_oracle(out, lse, q, k, v, causal=causal, softcap=2.5, scale=0.2)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_strided_transformers_layout(head_dim, causal):
    q, k, v = random_qkv(2, 1023, 1024, 8, 2, head_dim, torch.bfloat16, transposed=True)
    assert not q.is_contiguous()
    out, lse = run_forward(q, k, v, causal=causal)
    check_against_oracle(out, lse, q, k, v, causal=causal)


def test_fully_masked_rows_are_zero_with_neg_inf_lse():
    q, k, v = random_qkv(1, 300, 40, 4, 4, 64, torch.bfloat16)
    out, lse = run_forward(q, k, v, causal=True)  # bottom-right: the first 260 queries see no key
    assert torch.count_nonzero(out[:, :260]) == 0
    assert torch.isneginf(lse[:, :, :260]).all() and torch.isfinite(lse[:, :, 260:]).all()
    check_against_oracle(out, lse, q, k, v, causal=True)


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
    out, lse = run_forward(q, k, v, causal=causal, window=window, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                    max_seqlen_q=max(seqlens_q), max_seqlen_k=max(seqlens_k))  # fmt: skip
    assert out.shape == q.shape and lse.shape == (n_heads, q.shape[0])
    out_ref, lse_ref = varlen_attention_reference(q.float(), k.float(), v.float(), cu_q, cu_k, causal=causal,
                                                  window=window)  # fmt: skip
    # same-precision error, sequence by sequence
    err_lowp = 0.0
    for i in range(len(seqlens_q)):
        q0, q1, k0, k1 = cu_q[i].item(), cu_q[i + 1].item(), cu_k[i].item(), cu_k[i + 1].item()
        if q1 > q0:
            o = lowp_attention(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], causal=causal, window=window)[0]
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
    out, lse = run_forward(q, k, v, causal=causal, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(seqlens),
                    max_seqlen_k=max(seqlens))  # fmt: skip
    for i in (0, 2, 3):
        s0, s1 = cu[i].item(), cu[i + 1].item()
        alone, alone_lse = run_forward(q[None, s0:s1], k[None, s0:s1], v[None, s0:s1], causal=causal)
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
    out, lse = run_forward(q, k, v, causal=causal, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(seqlens),
                    max_seqlen_k=max(seqlens))  # fmt: skip
    for i, seqlen in enumerate(seqlens):
        s0, s1 = cu[i].item(), cu[i + 1].item()
        alone, alone_lse = run_forward(q[None, s0:s1], k[None, s0:s1], v[None, s0:s1], causal=causal)
        torch.testing.assert_close(out[s0:s1], alone[0], atol=0, rtol=0, msg=f"sequence {i} ({seqlen} tokens)")
        torch.testing.assert_close(lse[:, s0:s1], alone_lse[0], atol=0, rtol=0)
        if seqlen == max(seqlens):
            check_against_oracle(alone, alone_lse, q[None, s0:s1], k[None, s0:s1], v[None, s0:s1], causal=causal)


def test_broadcast_kv_heads_are_read_from_a_copy():
    """K/V expanded over their heads (stride 0: no tensor map describes it) give the materialised result."""
    q = torch.randn(2, 300, 8, 128, device="cuda", dtype=torch.bfloat16)
    k1 = torch.randn(2, 300, 1, 128, device="cuda", dtype=torch.bfloat16)
    v1 = torch.randn(2, 300, 1, 128, device="cuda", dtype=torch.bfloat16)
    k, v = k1.expand(-1, -1, 2, -1), v1.expand(-1, -1, 2, -1)  # (B, S, 2, D), head stride 0
    assert k.stride(2) == 0
    out, lse = run_forward(q, k, v, causal=True)
    expected, expected_lse = run_forward(q, k.contiguous(), v.contiguous(), causal=True)
    torch.testing.assert_close(out, expected, atol=0, rtol=0)
    torch.testing.assert_close(lse, expected_lse, atol=0, rtol=0)
    check_against_oracle(out, lse, q, k, v, causal=True)


def test_side_stream():
    q, k, v = random_qkv(2, 1023, 1024, 8, 2, 128, torch.bfloat16)
    expected, _ = run_forward(q, k, v, causal=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        q2 = q * 1.0  # produced on the side stream: the kernel must wait for it
        out, _ = run_forward(q2, k, v, causal=True)
        out = out * 1.0
    torch.cuda.current_stream().wait_stream(side)
    torch.testing.assert_close(out, expected, atol=0, rtol=0)


def test_cuda_graph_capture_and_replay():
    q, k, v = random_qkv(2, 513, 513, 8, 2, 64, torch.bfloat16)
    static_q = q.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (compile, load) outside the capture
        run_forward(static_q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out, static_lse = attention_forward(static_q, k, v, causal=True, softmax_scale=None, window_left=-1,
                                                   window_right=0, softcap=None)  # fmt: skip
    new_q = torch.randn_like(q)
    static_q.copy_(new_q)
    graph.replay()
    torch.cuda.synchronize()
    expected_out, expected_lse = run_forward(new_q, k, v, causal=True)
    torch.testing.assert_close(static_out, expected_out, atol=0, rtol=0)
    torch.testing.assert_close(static_lse, expected_lse, atol=0, rtol=0)


def test_torch_compile_fullgraph():
    q, k, v = random_qkv(2, 239, 300, 8, 2, 128, torch.bfloat16)

    def attend(q, k, v):
        out, lse = attention_forward(q, k, v, causal=True, softmax_scale=None, window_left=-1, window_right=0,
                                     softcap=None)  # fmt: skip
        return out * 2.0, lse

    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
    out, lse = compiled(q, k, v)
    expected_out, expected_lse = run_forward(q, k, v, causal=True)
    torch.testing.assert_close(out, expected_out * 2.0, atol=0, rtol=0)
    torch.testing.assert_close(lse, expected_lse, atol=0, rtol=0)


def test_unsupported_inputs_raise_kernel_unsupported():
    from hf_flashpatch.errors import KernelUnsupported

    q, k, v = random_qkv(1, 16, 16, 2, 2, 64, torch.float32)
    with pytest.raises(KernelUnsupported, match="got torch.float32"):
        run_forward(q, k, v)
    q, k, v = random_qkv(1, 16, 16, 2, 2, 288, torch.bfloat16)  # above 256: no build takes it, padded or not
    with pytest.raises(KernelUnsupported, match=r"head dims up to 256 .*got q \(1, 16, 2, 288\)"):
        run_forward(q, k, v)
