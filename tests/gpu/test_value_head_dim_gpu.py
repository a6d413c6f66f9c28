"""A value head dim of its own (``D_v != D``: multi-head latent attention, DeepSeek-V3's 192/128) on the CUDA
kernels, against the fp32 oracle: the native 192/128 forward and backward on Hopper (the backward with softcap
on zero-padded inputs), the 192/128 decode kernels, else the exact zero-padding route
(:mod:`hf_flashpatch.kernels.value_head_dim`). The same route serves one head dim that no build takes (16, and 80 as
in Phi-2, whose decode the decode kernels take), so those run every case here too.

Layout q ``(B, S_q, H, D)``, k ``(B, S_k, H_kv, D)``, v ``(B, S_k, H_kv, D_v)``, out ``(B, S_q, H, D_v)``. The
bound, as in the other GPU tests: the kernel's max error against the fp32 oracle at most twice that of a
same-precision torch run (torch's sdpa in bf16, which takes a V head dim of its own; a hand-built bf16
attention where sdpa cannot express the call: softcap, sinks) plus a small eps; gradients too. Awkward
lengths, mha/gqa/mqa, 192/128 and 64/32; the decode kernels at 192/128 (contiguous, paged, slot; split and
not) and the decode paths' documented fallback for other pairs; a tiny DeepSeek-V3-shaped model in bf16, patched
vs sdpa: logits within the usual tolerance and the same greedy tokens.
"""

import warnings

import pytest
import torch
import torch.nn.functional as F

from .test_backend_gpu import assert_same_greedy, generate_before_and_after_patch, left_padded_batch, seeded_on_gpu

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("pycuda")

import hf_flashpatch as hfp  # noqa: E402
from hf_flashpatch.kernels import forward as forward_module  # noqa: E402
from hf_flashpatch.kernels.build import device_arch  # noqa: E402
from hf_flashpatch.kernels.heuristics import (  # noqa: E402
    BACKWARD_HEAD_DIMS, native_backward_value_head_dim, native_value_head_dim, padding_head_dims,
)
from hf_flashpatch.reference import attention_reference, varlen_attention_reference, visibility_mask  # noqa: E402

DEV = "cuda"
# (q/k head dim, v head dim); 16 and 80 are one head dim that no forward or backward build takes, padded the same way
DIMS = {"192-128": (192, 128), "64-32": (64, 32), "16-16": (16, 16), "80-80": (80, 80)}
DECODE_DIMS = ("192-128", "80-80")  # the decode kernels take these themselves
HEADS = {"mha": (8, 8), "gqa": (8, 2), "mqa": (8, 1)}
SEQLENS = [(1, 113), (113, 113), (113, 239), (239, 239), (1, 239)]
FALLBACK_MARK = "kernel not used"  # the API's "CUDA kernel not used" and the ops' "forward/backward kernel not used"


def _qkv(batch, seqlen_q, seqlen_k, heads, dims, seed=0, requires_grad=False):
    torch.manual_seed(seed)
    (h, h_kv), (d, d_v) = heads, dims
    q = torch.randn(batch, seqlen_q, h, d, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(batch, seqlen_k, h_kv, d, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(batch, seqlen_k, h_kv, d_v, device=DEV, dtype=torch.bfloat16)
    return [t.requires_grad_(requires_grad) for t in (q, k, v)]


def _sdpa_bf16(q, k, v, causal, window=(-1, -1)):
    """The same-precision run: torch's sdpa in bf16 on ``(B, H, S, D)`` views, bottom-right causal (or the window
    ``(left, right)``) as a mask."""
    left, right = (-1, 0) if causal else window
    mask = visibility_mask(q.shape[1], k.shape[1], left, right, device=q.device)  # (S_q, S_k)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                                         enable_gqa=k.shape[2] != q.shape[2])  # fmt: skip
    return out.transpose(1, 2)  # (B, S_q, H, D_v)


def _lowp_attention(q, k, v, *, causal, window, softcap, sinks):
    """Same-precision attention by hand (every op in bf16) for what sdpa cannot take: softcap and sinks."""
    group = q.shape[2] // k.shape[2]
    qh = q.transpose(1, 2)  # (B, H, S_q, D)
    kh, vh = (t.transpose(1, 2).repeat_interleave(group, 1) for t in (k, v))  # (B, H, S_k, D | D_v)
    scores = (qh @ kh.transpose(-1, -2)) * q.shape[-1] ** -0.5  # (B, H, S_q, S_k) bf16, scale 1/sqrt(D)
    scores = softcap * torch.tanh(scores / softcap)
    left, right = window
    scores = scores.masked_fill(~visibility_mask(q.shape[1], k.shape[1], left, right, device=q.device), float("-inf"))
    column = sinks.to(q.dtype)[None, :, None, None].expand(*scores.shape[:3], 1)  # the sink, a logit without value
    probs = torch.softmax(torch.cat([scores, column], -1), -1)[..., :-1]
    return (probs @ vh).transpose(1, 2)  # (B, S_q, H, D_v)


def _within_twice(got, base, want, what):
    err = (got.float() - want.float()).abs().max().item()
    err_base = (base.float() - want.float()).abs().max().item()
    assert err <= 2 * err_base + 1e-3, f"{what}: kernel error {err:.3g} > 2 x same-precision error {err_base:.3g}"


def _no_fallback(caught):
    fallbacks = [str(w.message) for w in caught if FALLBACK_MARK in str(w.message)]
    assert not fallbacks, fallbacks


@pytest.fixture
def padded_calls(monkeypatch):
    """The head dims the kernels are launched with, ``(kind, D_q, D_k, D_v)``: "forward" and "backward" (the padded
    route gives them one, a kernel head dim; the native 192/128 forward the pair)."""
    from hf_flashpatch.kernels import backward as backward_module

    calls = []
    real_forward, real_backward = forward_module._launch, backward_module._kernel_backward

    def forward_launch(q, k, v, *args, **kwargs):
        calls.append(("forward", q.shape[-1], k.shape[-1], v.shape[-1]))
        return real_forward(q, k, v, *args, **kwargs)

    def backward_launch(cfg, dout, q, k, v, *args, **kwargs):
        calls.append(("backward", q.shape[-1], k.shape[-1], v.shape[-1]))
        return real_backward(cfg, dout, q, k, v, *args, **kwargs)

    monkeypatch.setattr(forward_module, "_launch", forward_launch)
    monkeypatch.setattr(backward_module, "_kernel_backward", backward_launch)
    return calls


def _forward_launch(dims, device) -> tuple:
    d, d_v = dims
    if native_value_head_dim(d, d_v, device_arch(device)):  # 192/128 on Hopper: a kernel takes the pair
        return ("forward", d, d, d_v)
    widths = padding_head_dims(forward_module.SUPPORTED_HEAD_DIMS, device_arch(device))  # Hopper: no 96
    padded = next(p for p in widths if p >= max(d, d_v))  # 192/128 off Hopper: 256
    return ("forward", padded, padded, padded)


def _backward_launch(dims, device) -> tuple:
    """The head dims the backward kernel is launched with (no softcap, not deterministic)."""
    d, d_v = dims
    if native_backward_value_head_dim(d, d_v, device_arch(device)):  # 192/128 on Hopper: the wgmma body takes it
        return ("backward", d, d, d_v)
    widths = padding_head_dims(BACKWARD_HEAD_DIMS, device_arch(device))  # 192/128: q/k stay, v is padded
    padded = next(p for p in widths if p >= max(d, d_v))
    return ("backward", padded, padded, padded)


@pytest.mark.parametrize("dims", list(DIMS))
@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.parametrize("seqlens", SEQLENS, ids=[f"{a}x{b}" for a, b in SEQLENS])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_forward_matches_the_oracle(dims, heads, seqlens, causal, padded_calls):
    """Inference calls: the decode kernel for few query rows at 192/128, else the native forward where a kernel
    takes the pair (192/128 on Hopper), else the padded one."""
    q, k, v = _qkv(2, *seqlens, HEADS[heads], DIMS[dims])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, lse = hfp.flash_attn_func(q, k, v, causal=causal, return_lse=True)
    _no_fallback(caught)
    h, h_kv = HEADS[heads]
    decoded = dims in DECODE_DIMS and seqlens[0] * (h // h_kv) <= 64  # the decode kernel's rows per KV head
    assert padded_calls == ([] if decoded else [_forward_launch(DIMS[dims], q.device)])
    want, want_lse = attention_reference(q.float(), k.float(), v.float(), causal=causal)
    assert out.shape == want.shape and out.dtype == torch.bfloat16 and not out.isnan().any()
    _within_twice(out, _sdpa_bf16(q, k, v, causal), want, "out")
    torch.testing.assert_close(lse, want_lse, atol=1e-3, rtol=1e-3)


GRAD_SEQLENS = [(113, 239), (239, 239), (1, 113), (1023, 1023)]


@pytest.mark.parametrize("dims", list(DIMS))
@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.parametrize("seqlens", GRAD_SEQLENS, ids=[f"{a}x{b}" for a, b in GRAD_SEQLENS])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gradients_match_the_oracle(dims, heads, seqlens, causal, padded_calls):
    """dq, dk, dv: the forward as for inference (native 192/128 on Hopper), the backward kernel taking the pair on
    Hopper at 192/128, else at the padded head dim (192 for 192/128: v, out and dout padded)."""
    q, k, v = _qkv(2, *seqlens, HEADS[heads], DIMS[dims], seed=1, requires_grad=True)
    grad = torch.randn(*q.shape[:3], v.shape[-1], device=DEV, dtype=torch.bfloat16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.autograd.grad(hfp.flash_attn_func(q, k, v, causal=causal), (q, k, v), grad)
    _no_fallback(caught)
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    wants = torch.autograd.grad(attention_reference(*leaves, causal=causal)[0], leaves, grad.float())
    low = [t.detach().requires_grad_() for t in (q, k, v)]
    bases = torch.autograd.grad(_sdpa_bf16(*low, causal), low, grad)
    for name, g, b, w in zip(["dq", "dk", "dv"], got, bases, wants):
        assert g.shape == w.shape and not g.isnan().any(), name
        _within_twice(g, b, w, name)
    assert padded_calls == [_forward_launch(DIMS[dims], q.device), _backward_launch(DIMS[dims], q.device)]


@pytest.mark.parametrize("dims", list(DIMS))
@pytest.mark.parametrize("window", [(-1, -1), (63, 0), (100, 17)], ids=["causal", "window63", "window100-17"])
def test_varlen_gradients_match_the_oracle(dims, window, padded_calls):
    """Packed sequences of awkward lengths (one of a single token), GQA, causal or a sliding window, gradients
    included: the backward's varlen geometry with v's head dim of its own."""
    lens = [1, 113, 239, 64, 300]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
    total = sum(lens)
    batch = _qkv(1, total, total, HEADS["gqa"], DIMS[dims], seed=5)
    q, k, v = (t[0].detach().requires_grad_() for t in batch)  # (T, H, D | D_v) each
    grad = torch.randn(total, q.shape[1], v.shape[-1], device=DEV, dtype=torch.bfloat16)  # (T, H, D_v)
    causal = window == (-1, -1)
    attn = dict(causal=True) if causal else dict(window=window)
    out = hfp.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), **attn)
    got = torch.autograd.grad(out, (q, k, v), grad)
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    want, _ = varlen_attention_reference(*leaves, cu, cu, **attn)
    wants = torch.autograd.grad(want, leaves, grad.float())
    low = [t.detach().requires_grad_() for t in (q, k, v)]
    base = torch.cat([_sdpa_bf16(low[0][None, a:b], low[1][None, a:b], low[2][None, a:b], causal, window)[0]
                      for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())])  # fmt: skip
    bases = torch.autograd.grad(base, low, grad)
    _within_twice(out, base, want, "out")
    for name, g, b, w in zip(["dq", "dk", "dv"], got, bases, wants):
        assert g.shape == w.shape and not g.isnan().any(), name
        _within_twice(g, b, w, name)
    assert padded_calls[-1] == _backward_launch(DIMS[dims], q.device)


@pytest.mark.parametrize("dims", list(DIMS))
def test_window_softcap_sinks_and_lse_with_gradients(dims):
    """The features that fold around the padded route: window and softcap inside the kernel, sinks after it."""
    q, k, v = _qkv(2, 113, 239, HEADS["gqa"], DIMS[dims], seed=2, requires_grad=True)
    sinks = (torch.randn(8, device=DEV) * 2).requires_grad_()
    attn = dict(causal=True, window=(63, 0), softcap=20.0)
    grad = torch.randn(*q.shape[:3], v.shape[-1], device=DEV, dtype=torch.bfloat16)
    out, lse = hfp.flash_attn_func(q, k, v, sinks=sinks, return_lse=True, **attn)
    got = torch.autograd.grad(out, (q, k, v, sinks), grad)
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v, sinks)]
    want, want_lse = attention_reference(*leaves[:3], sinks=leaves[3], **attn)
    wants = torch.autograd.grad(want, leaves, grad.float())
    low = [t.detach().requires_grad_() for t in (q, k, v, sinks)]
    base = _lowp_attention(*low[:3], causal=True, window=(63, 0), softcap=20.0, sinks=low[3])
    bases = torch.autograd.grad(base, low, grad)
    _within_twice(out, base, want, "out")
    torch.testing.assert_close(lse, want_lse, atol=1e-3, rtol=1e-3)
    for name, g, b, w in zip(["dq", "dk", "dv", "dsinks"], got, bases, wants):
        _within_twice(g, b, w, name)


@pytest.mark.parametrize("dims", list(DIMS))
def test_varlen_matches_the_oracle(dims):
    lens = [1, 113, 239, 64]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
    total = sum(lens)
    q, k, v = (t[0] for t in _qkv(1, total, total, HEADS["gqa"], DIMS[dims], seed=3))
    out = hfp.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    want, _ = varlen_attention_reference(q.float(), k.float(), v.float(), cu, cu, causal=True)
    base = torch.cat([_sdpa_bf16(q[None, a:b], k[None, a:b], v[None, a:b], True)[0]
                      for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())])  # fmt: skip
    _within_twice(out, base, want, "out")


@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.parametrize("cache", [239, 4096], ids=["cache239", "cache4096"])
def test_decode_kernels_at_192_128_match_the_oracle(heads, cache, monkeypatch):
    """The decode kernels at q/k 192, v 128 (no padding): contiguous cache with ragged lengths, paged pool and slot
    pool, one query token and four (speculative decoding), split-KV (4096 keys) and not; sentinel-filled
    allocator blocks under the outputs."""
    from hf_flashpatch.kernels import decode as decode_module

    monkeypatch.setattr(hfp.api, "_warned", set())
    built = []
    real_plan = decode_module.decode_plan

    def recording_plan(*args):
        plan = real_plan(*args)
        built.append((plan.config.head_dim, plan.config.head_dim_v, plan.num_splits))
        return plan

    monkeypatch.setattr(decode_module, "decode_plan", recording_plan)
    for seqlen_q in (1, 4):
        q, k, v = _qkv(3, seqlen_q, cache, HEADS[heads], DIMS["192-128"], seed=4)
        lens = torch.tensor([cache, 1 + seqlen_q, 113], dtype=torch.int32, device=DEV)
        torch.full((1 << 22,), float("nan"), device=DEV)  # a NaN-filled block for the outputs to land on
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = hfp.flash_attn_with_kvcache(q, k, v, lens)
            page_size = cache if cache < 256 else 16  # one page per row, or 16-key pages
            num_pages = 3 * cache // page_size
            table = torch.randperm(num_pages, device=DEV, dtype=torch.int32).view(3, -1)  # shuffled pages
            k_pool = torch.empty(num_pages, page_size, *k.shape[2:], device=DEV, dtype=k.dtype)
            v_pool = torch.empty(num_pages, page_size, *v.shape[2:], device=DEV, dtype=v.dtype)
            k_pool[table.long()] = k.view(3, -1, page_size, *k.shape[2:])  # (3, pages per row, page_size, H_kv, D)
            v_pool[table.long()] = v.view(3, -1, page_size, *v.shape[2:])
            paged = hfp.flash_attn_paged_decode(q, k_pool, v_pool, table, lens)
            slots = torch.cat([torch.arange(b * cache, b * cache + n, device=DEV) for b, n in enumerate(lens.tolist())])
            cu_k = torch.tensor([0, *lens.cumsum(0).tolist()], dtype=torch.int32, device=DEV)
            cu_q = torch.arange(0, 4 * seqlen_q, seqlen_q, dtype=torch.int32, device=DEV)
            slot = hfp.flash_attn_slot_varlen_func(q.reshape(-1, *q.shape[2:]), k.reshape(-1, *k.shape[2:]),
                                                   v.reshape(-1, *v.shape[2:]), slots, cu_q, cu_k, seqlen_q, cache,
                                                   causal=True)  # fmt: skip
        _no_fallback(caught)
        for b, n in enumerate(lens.tolist()):
            rows = (q[b : b + 1], k[b : b + 1, :n], v[b : b + 1, :n])
            want, _ = attention_reference(*(t.float() for t in rows), causal=True)
            base = _sdpa_bf16(*rows, True)
            _within_twice(out[b : b + 1], base, want, f"with_kvcache row {b}")
            _within_twice(paged[b : b + 1], base, want, f"paged row {b}")
            _within_twice(slot[b * seqlen_q : (b + 1) * seqlen_q][None], base, want, f"slot row {b}")
    assert built and all(entry[:2] == (192, 128) for entry in built)
    if cache == 4096:
        assert any(splits > 1 for *_, splits in built), built  # the split-KV merge ran at D_v


def test_decode_paths_take_the_documented_fallback_for_other_pairs(monkeypatch):
    """No decode kernel is built for 64/32: flash_attn_with_kvcache does not pad the cache, it warns once and runs
    the torch fallback, exactly."""
    monkeypatch.setattr(hfp.api, "_warned", set())
    q, k, v = _qkv(3, 1, 239, HEADS["gqa"], DIMS["64-32"], seed=4)
    lens = torch.tensor([239, 1, 113], dtype=torch.int32, device=DEV)
    with pytest.warns(UserWarning, match=r"decode kernel serves .* got q \(3, 1, 8, 64\), k \(3, 239, 2, 64\), v "
                                         r"\(3, 239, 2, 32\)"):  # fmt: skip
        out = hfp.flash_attn_with_kvcache(q, k, v, lens)
    for b, n in enumerate(lens.tolist()):
        want, _ = attention_reference(q[b : b + 1].float(), k[b : b + 1, :n].float(), v[b : b + 1, :n].float(),
                                      causal=True)  # fmt: skip
        _within_twice(out[b : b + 1], _sdpa_bf16(q[b : b + 1], k[b : b + 1, :n], v[b : b + 1, :n], True), want, "out")


# ------------------------------------------------------------------------------------ a DeepSeek-V3-shaped model


def tiny_deepseek_v3(attn_implementation="sdpa", dtype=torch.bfloat16):
    """DeepSeek-V3's attention dims (q/k 128 + 64 = 192, v 128), 4 heads, 2 layers, random weights."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    config = DeepseekV3Config(
        vocab_size=512, hidden_size=512, intermediate_size=1024, moe_intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=128, q_lora_rank=128, qk_rope_head_dim=64,
        qk_nope_head_dim=128, v_head_dim=128, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        n_group=1, topk_group=1, first_k_dense_replace=1, max_position_embeddings=1024, pad_token_id=0,
        initializer_range=0.2,  # peaked logits: greedy choices are not near-ties between two backends
    )  # fmt: skip
    return seeded_on_gpu(DeepseekV3ForCausalLM, config, attn_implementation, dtype)


def test_deepseek_v3_logits_within_twice_sdpa_error():
    ids, mask = left_padded_batch([113, 1, 64, 97])
    model = tiny_deepseek_v3()
    real = mask.bool()
    with torch.no_grad():
        sdpa = model(input_ids=ids, attention_mask=mask).logits[real].float()
        exact = model.float()(input_ids=ids, attention_mask=mask).logits[real]
        hfp.patch(model.to(torch.bfloat16))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ours = model(input_ids=ids, attention_mask=mask).logits[real].float()
    _no_fallback(caught)
    assert not [w for w in caught if "cannot serve" in str(w.message)]  # the prefill is ours (native on Hopper)
    err, err_sdpa = (ours - exact).abs().max().item(), (sdpa - exact).abs().max().item()
    assert err <= 2 * err_sdpa + 1e-2, (err, err_sdpa)


def test_deepseek_v3_greedy_generate_matches_sdpa(monkeypatch):
    """Prefill on our kernels (the native 192/128 forward on Hopper), each decode step on the 192/128 decode kernel:
    no fallback of any kind."""
    from hf_flashpatch.backend import unsupported

    monkeypatch.setattr(unsupported, "_warned", set())
    ids, mask = left_padded_batch([113, 1, 64, 97], seed=1)
    model = tiny_deepseek_v3()
    kwargs = dict(attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0, eos_token_id=None)
    want, got, caught = generate_before_and_after_patch(model, ids, kwargs)
    _no_fallback(caught)
    reasons = [str(w.message) for w in caught if "cannot serve" in str(w.message)]
    assert reasons == []
    assert_same_greedy(model, got, want, mask)  # equal tokens, or a divergence at a bf16 near-tie


def test_deepseek_v3_compiled_static_cache_generate_is_the_eager_generate():
    """Static-cache ``generate`` compiles its decode step: the traced path's few-query steps run the decode op at
    192/128 (under CUDA graphs) where eager decoding unpads into varlen. The tokens as the eager patched run's, up
    to a bf16 near-tie; nothing takes a fallback."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    ids, mask = left_padded_batch([113, 1, 64, 97], seed=2)
    model = tiny_deepseek_v3()
    hfp.patch(model)
    kwargs = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, cache_implementation="static", pad_token_id=0,
                  eos_token_id=None)  # fmt: skip
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        eager = model.generate(input_ids=ids, disable_compile=True, **kwargs)
        compiled = model.generate(input_ids=ids, **kwargs)  # the auto-compiled decode step
    torch._dynamo.reset()
    _no_fallback(caught)
    assert not [w for w in caught if "cannot serve" in str(w.message)]
    assert counters["frames"]["ok"] >= 1  # it did compile
    assert_same_greedy(model, compiled, eager, mask)
