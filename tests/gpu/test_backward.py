"""The FlashAttention backward kernel against fp32 oracle gradients, on a real GPU.

Layout: q/out/dout ``(B, S_q, H, D)``, k/v ``(B, S_k, H_kv, D)`` (varlen: ``(T, H, D)``). The oracle is
autograd through :func:`hf_flashpatch.reference.attention_reference` on fp32 copies. The bound, as in
flash-attn's tests: each of dq, dk, dv has max error against the oracle at most twice that of a
same-precision torch backward (SDPA where it computes the same function, else autograd through
attention in the input dtype) plus a small eps. ``attention_backward`` is fed ``out``/``lse`` from the
fp32 oracle, so these tests do not depend on the forward kernel; the end-to-end tests go through
``hf_flashpatch.flash_attn_func(...).backward()``. The allocator is filled with NaN before each
kernel call, so a gradient element the kernel never writes shows up as NaN.

The shipped body choice and, at d64/d128, the other bodies this GPU can run (``tiled``, other GPUs' choice,
and ``default``, the deterministic path's body, each forced through the heuristics: the ``variant``
fixture) run the core grid (shapes x mha/gqa/mqa x dtypes x d64/d128 x causal), the window, softcap and
varlen cases; each checks that the intended body is the one launched.
"""

import math
import zlib

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("pycuda")

import hf_flashpatch  # noqa: E402
from hf_flashpatch.kernels import backward as bwd  # noqa: E402
from hf_flashpatch.kernels import heuristics  # noqa: E402
from hf_flashpatch.kernels.build import device_arch  # noqa: E402
from hf_flashpatch.reference import attention_reference, varlen_attention_reference, visibility_mask  # noqa: E402

DTYPES = [torch.bfloat16, torch.float16]
SEQLENS = [(1, 1), (113, 203), (239, 1), (1023, 1024)]
HEADS = {"mha": (4, 4), "gqa": (4, 2), "mqa": (4, 1)}
VARIANTS = ["shipped", "tiled", "default"]  # the shipped choice, and two bodies forced at d64/d128


@pytest.fixture(scope="module", autouse=True)
def _compile_all_builds():
    """Compile every shipped build in parallel up front: the disk cache then serves the tests."""
    from concurrent.futures import ThreadPoolExecutor

    from hf_flashpatch.kernels.build import compile_cubin

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(compile_cubin, bwd.all_builds()))


def _shipped_body(head_dim):
    if head_dim not in (64, 128):
        return "default"
    return "wgmma" if device_arch(torch.device("cuda")) == "sm_90a" else "tiled"


@pytest.fixture(params=VARIANTS)
def variant(request, monkeypatch):
    """Force a body by giving BackwardConfig.choose other tiles: "tiled" takes the sm_80 choice (built for
    this GPU), "default" the deterministic path's; "shipped" leaves the heuristics alone."""
    real = heuristics.backward_tiles
    if request.param == "tiled":
        monkeypatch.setattr(bwd, "backward_tiles", lambda d, softcap, arch="sm_90a", deterministic=False, **kw:
                            real(d, softcap, "sm_80", deterministic, **kw))  # fmt: skip
    elif request.param == "default":
        monkeypatch.setattr(bwd, "backward_tiles", lambda d, softcap, arch="sm_90a", deterministic=False, **kw:
                            real(d, softcap, arch, True, **kw))  # fmt: skip
    return request.param


def _skip_unless_served(variant, head_dim, softcap=False):
    """A forced body that is the shipped one for this head dim is already covered by "shipped"."""
    if variant != "shipped" and (head_dim not in (64, 128) or _shipped_body(head_dim) == variant):
        pytest.skip(f"{variant} is the shipped body at head dim {head_dim} here")


def _assert_variant_used(variant, head_dim, dtype, softcap=False):
    """The call under test really launches the intended body."""
    cfg = bwd.BackwardConfig.choose(head_dim, dtype, bool(softcap), device_arch(torch.device("cuda")))
    want = _shipped_body(head_dim) if variant == "shipped" else variant
    assert cfg.body == want, f"{variant}: got body {cfg.body!r} for d{head_dim}"


def _poison_allocator(nbytes: int) -> None:
    """Leave NaN-filled blocks in torch's caching allocator so torch.empty inside the op gets them."""
    blocks = [torch.full((max(nbytes // 4, 1),), float("nan"), device="cuda") for _ in range(3)]
    del blocks


def _window(causal, window):
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right


def _inputs(batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim, dtype):
    q = torch.randn(batch, seqlen_q, heads, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(batch, seqlen_k, kv_heads, head_dim, device="cuda", dtype=dtype)
    v = torch.randn(batch, seqlen_k, kv_heads, head_dim, device="cuda", dtype=dtype)
    dout = torch.randn(batch, seqlen_q, heads, head_dim, device="cuda", dtype=dtype)
    return q, k, v, dout


def _oracle(q, k, v, dout, *, causal=False, window=(-1, -1), softcap=None, scale=None):
    """fp32 out, lse and gradients by autograd through the naive reference."""
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    out, lse = attention_reference(qf, kf, vf, causal=causal, window=window, softcap=softcap, softmax_scale=scale)
    out.backward(dout.float())
    return out.detach(), lse.detach(), (qf.grad, kf.grad, vf.grad)


def _lowp_grads(q, k, v, dout, *, causal=False, window=(-1, -1), softcap=None, scale=None):
    """Same-precision torch backward: SDPA (flash/efficient/math as torch picks) when it computes the same
    function, else autograd through attention with every matmul in q's dtype."""
    qh, kh, vh = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))  # (B, H, S, D)
    left, right = _window(causal, window)
    visible = visibility_mask(q.shape[1], k.shape[1], left, right, device=q.device)  # (S_q, S_k)
    group = q.shape[2] // k.shape[2]
    if not softcap and bool(visible.any(dim=-1).all()):
        mask = None if (left < 0 and right < 0) else visible
        causal_sdpa = causal and mask is None and q.shape[1] == k.shape[1]
        if causal and not causal_sdpa:
            mask = visible
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, is_causal=causal_sdpa, scale=scale,
                                             enable_gqa=group > 1)  # fmt: skip
    else:
        scale_ = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
        scores = torch.matmul(qh, kh.repeat_interleave(group, 1).transpose(-1, -2)) * scale_  # (B, H, S_q, S_k)
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1).nan_to_num(0.0)
        out = torch.matmul(probs, vh.repeat_interleave(group, 1))  # (B, H, S_q, D)
    out.backward(dout.transpose(1, 2))
    return tuple(t.grad.transpose(1, 2) for t in (qh, kh, vh))


def _assert_grads(grads, ref, lowp, names=("dq", "dk", "dv"), eps=1e-4):
    for name, g, r, lp in zip(names, grads, ref, lowp):
        assert g.shape == r.shape, f"{name}: shape {tuple(g.shape)} != {tuple(r.shape)}"
        assert not g.isnan().any(), f"{name}: unwritten or NaN elements"
        err = (g.float() - r).abs().max().item()
        err_lowp = (lp.float() - r).abs().max().item()
        assert err <= 2 * err_lowp + eps, f"{name}: kernel error {err:.3g} > 2 x same-precision error {err_lowp:.3g}"


def _kernel_grads(q, k, v, dout, out, lse, *, causal=False, window=(-1, -1), softcap=None, scale=None,
                  deterministic=False, **varlen):  # fmt: skip
    _poison_allocator(4 * q.numel() * q.element_size())
    left, right = window
    return bwd.attention_backward(dout, q, k, v, out, lse, causal=causal, window_left=left, window_right=right,
                                  softcap=softcap or 0.0, softmax_scale=scale, deterministic=deterministic, **varlen)  # fmt: skip


def _check(batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim, dtype, deterministic=False, variant=None,
           **kw):  # fmt: skip
    if variant is not None:
        _assert_variant_used(variant, head_dim, dtype, kw.get("softcap"))
    case = (batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim, dtype, tuple(sorted(kw.items())))
    if case not in _CASES:  # the variants of one case share its random inputs, oracle and same-precision run
        torch.manual_seed(zlib.crc32(repr(case).encode()))
        q, k, v, dout = _inputs(batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim, dtype)
        out_ref, lse_ref, ref = _oracle(q, k, v, dout, **kw)
        _CASES[case] = (q, k, v, dout, out_ref.to(dtype), lse_ref, ref, _lowp_grads(q, k, v, dout, **kw))
    q, k, v, dout, out, lse, ref, lowp = _CASES[case]
    grads = _kernel_grads(q, k, v, dout, out, lse, deterministic=deterministic, **kw)
    assert [g.dtype for g in grads] == [dtype] * 3
    _assert_grads(grads, ref, lowp)


_CASES: dict = {}  # case -> inputs, oracle and same-precision gradients (a few hundred MB at most)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", list(HEADS), ids=str)
@pytest.mark.parametrize("seqlens", SEQLENS, ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_backward_shapes(seqlens, heads, head_dim, dtype, causal, variant):
    _skip_unless_served(variant, head_dim)
    _check(2, *seqlens, *HEADS[heads], head_dim, dtype, causal=causal, variant=variant)


@pytest.mark.parametrize("head_dim", [32, 96, 192, 256])  # 192: the padded backward of 192/128 (MLA)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("deterministic", [False, True])
def test_backward_other_head_dims(head_dim, causal, deterministic):
    _check(2, 239, 203, 4, 2, head_dim, torch.bfloat16, causal=causal, deterministic=deterministic)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "seqlens,window,causal",
    [((1023, 1024), (100, 0), True), ((1023, 1024), (64, 32), False), ((239, 511), (17, -1), False),
     ((511, 239), (-1, 5), False), ((113, 203), (0, 0), False)],
)  # fmt: skip
def test_backward_window(seqlens, window, causal, dtype, variant):
    _skip_unless_served(variant, 128)
    _check(2, *seqlens, 4, 2, 128, dtype, causal=causal, window=window, variant=variant)


@pytest.mark.parametrize("head_dim", [64, 128, 192, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_softcap(head_dim, causal, variant):
    _skip_unless_served(variant, head_dim, softcap=True)
    _check(2, 239, 512, 4, 1, head_dim, torch.bfloat16, causal=causal, softcap=5.0, scale=0.3, variant=variant)


def test_backward_strided_inputs():
    """(B, H, S, D) tensors viewed as (B, S, H, D), as transformers hands them: no copy needed."""
    q, k, v, dout = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in _inputs(2, 300, 300, 4, 2, 64, torch.bfloat16))
    assert not q.is_contiguous()
    out_ref, lse_ref, ref = _oracle(q, k, v, dout, causal=True)
    grads = _kernel_grads(q, k, v, dout, out_ref.to(q.dtype), lse_ref, causal=True)
    _assert_grads(grads, ref, _lowp_grads(q, k, v, dout, causal=True))


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", ["gqa", "mqa"])
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_varlen(heads, deterministic, causal, head_dim, variant):
    if variant != "shipped" and deterministic:
        pytest.skip("deterministic=True takes the default body whatever the heuristics say")
    _skip_unless_served(variant, head_dim)
    h, hk = HEADS[heads]
    lens_q, lens_k = [1, 113, 0, 239, 1023, 64], [1, 203, 7, 239, 1024, 1]
    cu_q = torch.tensor([0] + lens_q, device="cuda").cumsum(0).int()
    cu_k = torch.tensor([0] + lens_k, device="cuda").cumsum(0).int()
    tq, tk = int(cu_q[-1]), int(cu_k[-1])
    dtype, d = torch.bfloat16, head_dim
    _assert_variant_used(variant, d, dtype)
    q = torch.randn(tq, h, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(tk, hk, d, device="cuda", dtype=dtype) for _ in range(2))
    dout = torch.randn_like(q)
    qf, kf, vf = (t.float().requires_grad_() for t in (q, k, v))
    out_ref, lse_ref = varlen_attention_reference(qf, kf, vf, cu_q, cu_k, causal=causal)
    out_ref.backward(dout.float())
    ref = (qf.grad, kf.grad, vf.grad)
    grads = _kernel_grads(q, k, v, dout, out_ref.detach().to(dtype), lse_ref.detach(), causal=causal,
                          deterministic=deterministic, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                          max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k))  # fmt: skip
    lowp = [torch.zeros_like(t) for t in (q, k, v)]
    for i in range(len(lens_q)):
        q0, q1, k0, k1 = cu_q[i].item(), cu_q[i + 1].item(), cu_k[i].item(), cu_k[i + 1].item()
        if q1 == q0 or k1 == k0:
            continue
        g = _lowp_grads(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], dout[None, q0:q1], causal=causal)
        lowp[0][q0:q1], lowp[1][k0:k1], lowp[2][k0:k1] = g[0][0], g[1][0], g[2][0]
    _assert_grads(grads, ref, lowp)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_backward_varlen_ignores_tokens_past_the_last_sequence(head_dim, deterministic):
    """Tokens past cu_seqlens[-1] belong to no sequence: NaN in their q, out, dout and lse changes no gradient (the
    Hopper body's loads read them as the rows past the last sequence's end, and zero them), and their dq is 0."""
    torch.manual_seed(head_dim)
    cu = torch.tensor([0, 113, 413], device="cuda", dtype=torch.int32)
    tokens, extra, dtype = 413, 37, torch.bfloat16
    q = torch.randn(tokens + extra, 4, head_dim, device="cuda", dtype=dtype)
    k, v = (torch.randn(tokens, 2, head_dim, device="cuda", dtype=dtype) for _ in range(2))
    dout = torch.randn_like(q)
    out, lse = varlen_attention_reference(q[:tokens].float(), k.float(), v.float(), cu, cu, causal=True)  # lse (H, T)
    out = torch.cat([out.to(dtype), torch.full((extra, 4, head_dim), float("nan"), device="cuda", dtype=dtype)])
    lse = torch.cat([lse, torch.full((4, extra), float("nan"), device="cuda")], dim=1)
    q[tokens:], dout[tokens:] = float("nan"), float("nan")
    kw = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=300, max_seqlen_k=300, causal=True,
              deterministic=deterministic)  # fmt: skip
    clean = bwd.attention_backward(dout[:tokens], q[:tokens], k, v, out[:tokens], lse[:, :tokens].contiguous(), **kw)
    dirty = bwd.attention_backward(dout, q, k, v, out, lse, **kw)
    assert torch.equal(dirty[1], clean[1]) and torch.equal(dirty[2], clean[2])  # dk, dv: same steps, same zeros
    assert torch.allclose(dirty[0][:tokens].float(), clean[0].float(), atol=1e-2, rtol=1e-2)  # dq (added in any order)
    assert torch.equal(dirty[0][tokens:], torch.zeros_like(dirty[0][tokens:]))


@pytest.mark.parametrize("heavy_first_max_waves", [0, 10**9], ids=["head_by_head", "heaviest_first"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", list(HEADS), ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_backward_both_block_orders(heads, head_dim, causal, heavy_first_max_waves, monkeypatch):
    """Both dK/dV block orders of dkdv_grid (the wgmma body takes either; the test shapes are few waves, so
    the core grid runs heaviest first only) meet the oracle bound, and give the same dK / dV bit for bit
    (each block owns its keys, no atomics), on a varlen-free causal and full case with partial tiles."""
    monkeypatch.setattr(bwd, "HEAVY_FIRST_MAX_WAVES", heavy_first_max_waves)
    _check(3, 239, 1023, *HEADS[heads], head_dim, torch.bfloat16, causal=causal)
    q, k, v, dout, out, lse, ref, lowp = _CASES[(3, 239, 1023, *HEADS[heads], head_dim, torch.bfloat16,
                                                 (("causal", causal),))]  # fmt: skip
    mine = _kernel_grads(q, k, v, dout, out, lse, causal=causal)
    monkeypatch.setattr(bwd, "HEAVY_FIRST_MAX_WAVES", 10**9 - heavy_first_max_waves)  # the other order
    other = _kernel_grads(q, k, v, dout, out, lse, causal=causal)
    assert torch.equal(mine[1], other[1]) and torch.equal(mine[2], other[2])


@pytest.mark.parametrize("heads", ["mha", "gqa"])
def test_backward_deterministic_bitwise(heads):
    """deterministic=True: two runs give bit-identical gradients (and they are correct)."""
    kw = dict(causal=True, deterministic=True)
    q, k, v, dout = _inputs(2, 1023, 1024, *HEADS[heads], 128, torch.bfloat16)
    out_ref, lse_ref, ref = _oracle(q, k, v, dout, causal=True)
    first = _kernel_grads(q, k, v, dout, out_ref.to(q.dtype), lse_ref, **kw)
    second = _kernel_grads(q, k, v, dout, out_ref.to(q.dtype), lse_ref, **kw)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    _assert_grads(first, ref, _lowp_grads(q, k, v, dout, causal=True))


def test_backward_on_side_stream():
    q, k, v, dout = _inputs(2, 513, 513, 4, 2, 64, torch.bfloat16)
    out_ref, lse_ref, _ = _oracle(q, k, v, dout, causal=True)
    expected = _kernel_grads(q, k, v, dout, out_ref.to(q.dtype), lse_ref, causal=True, deterministic=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = _kernel_grads(q, k, v, dout, out_ref.to(q.dtype), lse_ref, causal=True, deterministic=True)
    torch.cuda.current_stream().wait_stream(side)
    for a, b in zip(expected, got):
        assert torch.equal(a, b)


# ---------------------------------------------------------------------------- end to end (forward kernel + autograd)


def _forward_op_available() -> bool:
    try:
        from hf_flashpatch.kernels import forward  # noqa: F401
    except ImportError:
        return False
    return hasattr(torch.ops.hf_flashpatch, "attention_forward") and bwd.register_autograd()


needs_forward = pytest.mark.skipif(not _forward_op_available(), reason="forward op not available")


@needs_forward
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads", list(HEADS), ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_end_to_end_flash_attn_func(heads, dtype, causal, monkeypatch):
    calls = []
    real = bwd._kernel_backward
    monkeypatch.setattr(bwd, "_kernel_backward", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    q, k, v, dout = _inputs(2, 1023, 1024, *HEADS[heads], 128, dtype)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    hf_flashpatch.flash_attn_func(*leaves, causal=causal).backward(dout)
    assert calls, "the backward kernel did not run"
    _, _, ref = _oracle(q, k, v, dout, causal=causal)
    _assert_grads([t.grad for t in leaves], ref, _lowp_grads(q, k, v, dout, causal=causal))


@needs_forward
@pytest.mark.parametrize("deterministic", [False, True])
def test_end_to_end_varlen(deterministic):
    """flash_attn_varlen_func(...).backward() on packed GQA sequences, causal, against the fp32 oracle."""
    lens = [1, 113, 239, 1023]
    cu = torch.tensor([0] + lens, device="cuda").cumsum(0).int()
    total = int(cu[-1])
    q = torch.randn(total, 4, 128, device="cuda", dtype=torch.bfloat16)  # (T, H, D)
    k, v = (torch.randn(total, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))  # (T, H_kv, D)
    dout = torch.randn_like(q)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = hf_flashpatch.flash_attn_varlen_func(*leaves, cu, cu, max(lens), max(lens), causal=True,
                                               deterministic=deterministic)  # fmt: skip
    out.backward(dout)
    qf, kf, vf = (t.float().requires_grad_() for t in (q, k, v))
    out_ref, _ = varlen_attention_reference(qf, kf, vf, cu, cu, causal=True)
    out_ref.backward(dout.float())
    lowp = [torch.zeros_like(t) for t in (q, k, v)]
    for i in range(len(lens)):
        a, b = cu[i].item(), cu[i + 1].item()
        g = _lowp_grads(q[None, a:b], k[None, a:b], v[None, a:b], dout[None, a:b], causal=True)
        lowp[0][a:b], lowp[1][a:b], lowp[2][a:b] = g[0][0], g[1][0], g[2][0]
    _assert_grads([t.grad for t in leaves], (qf.grad, kf.grad, vf.grad), lowp)


@needs_forward
def test_end_to_end_lse_gradient():
    """A loss on the returned LSE flows back too (D = rowsum(dO * O) - dLSE)."""
    q, k, v, dout = _inputs(1, 257, 300, 4, 2, 64, torch.bfloat16)
    dlse = torch.randn(1, 4, 257, device="cuda")
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = hf_flashpatch.flash_attn_func(*leaves, causal=True, return_lse=True)
    ((out.float() * dout.float()).sum() + (lse * dlse).sum()).backward()
    qf, kf, vf = (t.float().requires_grad_() for t in (q, k, v))
    out_r, lse_r = attention_reference(qf, kf, vf, causal=True)
    ((out_r * dout.float()).sum() + (lse_r * dlse).sum()).backward()
    for got, want in zip(leaves, (qf, kf, vf)):
        err = (got.grad.float() - want.grad).abs().max().item()
        assert err <= 0.02 * want.grad.abs().max().item() + 1e-3, f"error {err:.3g}"


@needs_forward
def test_torch_compile_fullgraph():
    """The forward and backward custom ops trace under torch.compile (register_fake) and match eager."""
    q, k, v, dout = _inputs(2, 256, 256, 4, 2, 64, torch.bfloat16)

    def loss(q, k, v):
        out, _ = torch.ops.hf_flashpatch.attention_forward(q, k, v, None, None, 0, 0, 0.125, True, -1, 0, 0.0, True)
        return (out.float() * dout.float()).sum()

    eager = [t.clone().requires_grad_() for t in (q, k, v)]
    loss(*eager).backward()
    compiled = [t.clone().requires_grad_() for t in (q, k, v)]
    torch.compile(loss, fullgraph=True)(*compiled).backward()
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a.grad, b.grad)


# ---------------------------------------------------------------------------- the documented torch fallback


def test_fallback_matches_oracle_for_fp32(monkeypatch):
    """fp32 is not served by the kernel: attention_backward refuses, the op falls back to torch math (and warns once:
    kernels.warn_fallback_once)."""
    q, k, v, dout = (t.float() for t in _inputs(2, 129, 77, 4, 2, 64, torch.bfloat16))
    out_ref, lse_ref, ref = _oracle(q, k, v, dout, causal=True, softcap=3.0)
    with pytest.raises(hf_flashpatch.KernelUnsupported):
        bwd.attention_backward(dout, q, k, v, out_ref, lse_ref, causal=True, softcap=3.0)
    monkeypatch.setattr(hf_flashpatch.kernels, "_warned", set())
    with pytest.warns(UserWarning, match="backward kernel not used .*fallback"):
        grads = bwd._backward_op(dout, q, k, v, out_ref, lse_ref, None, None, None, 129, 77, 0.125, -1, 0, 3.0, False)
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g, r, atol=2e-4, rtol=1e-4)
