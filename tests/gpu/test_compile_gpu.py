"""A patched model under ``torch.compile`` on CUDA, the user's defaults (inductor; transformers'
CUDA-graph ``reduce-overhead`` for static-cache ``generate``): no graph break, the CUDA kernels serve
the calls (no fallback warning), and the answers match the uncompiled model's."""

import warnings

import pytest
import torch
from torch._dynamo.utils import counters

from .greedy import first_divergence_is_near_tie
from .test_backend_gpu import FALLBACK_MARK, LENGTHS, NEW_TOKENS, tiny_llama

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)


def _left_padded(lengths, vocab=512, seed=0):
    gen = torch.Generator().manual_seed(seed)
    total = max(lengths)
    ids = torch.zeros(len(lengths), total, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, total - n :] = torch.randint(3, vocab, (n,), generator=gen)
        mask[row, total - n :] = 1
    return ids.cuda(), mask.cuda()


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def test_compiled_static_cache_generate_is_the_eager_generate():
    model = tiny_llama("hfpatch")
    ids, mask = _left_padded(LENGTHS)
    kwargs = dict(max_new_tokens=NEW_TOKENS, do_sample=False, cache_implementation="static", pad_token_id=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        eager = model.generate(input_ids=ids, attention_mask=mask, disable_compile=True, **kwargs)
        compiled = model.generate(input_ids=ids, attention_mask=mask, **kwargs)  # auto-compiled decode step
        again = model.generate(input_ids=ids, attention_mask=mask, **kwargs)  # replays the CUDA graphs
    assert not [w for w in caught if FALLBACK_MARK in str(w.message)]
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["frames"]["ok"] >= 1  # it did compile
    assert torch.equal(again, compiled)
    # eager decodes padded rows through varlen, compiled through the decode kernel's key ranges: bf16
    # rounding differs, so a row may only diverge at a near-tie
    prompt = ids.shape[1]
    for row, n in enumerate(LENGTHS):
        context = ids[row, prompt - n :].tolist()
        ok, why = first_divergence_is_near_tie(model, context, compiled[row, prompt:].tolist(),
                                               eager[row, prompt:].tolist())  # fmt: skip
        assert ok, f"row {row}: {why}"


def _loss_and_grads(model, ids, labels, kwargs, compiled=False):
    model.zero_grad()
    run = torch.compile(model, fullgraph=True) if compiled else model
    loss = run(input_ids=ids, labels=labels, use_cache=False, **kwargs).loss
    loss.backward()
    return loss.float(), [p.grad.float().clone() for p in model.parameters()]


@pytest.mark.parametrize("masked", [False, True])
def test_compiled_training_step_meets_the_oracle_bound(masked):
    """Loss and gradients of a compiled bf16 step against the same weights in fp32 (eager sdpa): within
    twice the error of eager bf16 sdpa, plus a small floor (inductor fuses and re-rounds the other ops)."""
    ids, mask = _left_padded([113, 113] if not masked else [113, 64])
    kwargs = dict(attention_mask=mask) if masked else {}
    labels = ids.masked_fill(mask == 0, -100)
    model = tiny_llama("hfpatch").train()
    got_loss, got = _loss_and_grads(model, ids, labels, kwargs, compiled=True)
    model.set_attn_implementation("sdpa")
    half_loss, half = _loss_and_grads(model, ids, labels, kwargs)
    model.float()
    ref_loss, ref = _loss_and_grads(model, ids, labels, kwargs)
    assert not counters["graph_break"], dict(counters["graph_break"])  # fullgraph=True raises on one anyway
    assert (got_loss - ref_loss).abs() <= 2 * (half_loss - ref_loss).abs() + 1e-2
    for g, h, r in zip(got, half, ref):
        scale = r.abs().max().clamp_min(1e-6)
        assert (g - r).abs().max() / scale <= 2 * (h - r).abs().max() / scale + 2e-2


@pytest.mark.parametrize("inputs", ["padding", "all real", "position_ids"])
def test_compiled_inference_with_the_default_cache_meets_the_oracle_bound(inputs):
    """The ordinary compiled inference call (inductor, ``use_cache`` left on) through the masked op: its kernel
    path (every key real; one packed sequence) and its dense path (padding; several packed sequences), the logits
    at real tokens within twice eager bf16 sdpa's error of the fp32 model, plus a small floor."""
    model = tiny_llama("hfpatch")
    if inputs == "position_ids":
        ids, _ = _left_padded([96])
        kwargs = dict(position_ids=torch.cat([torch.arange(40), torch.arange(56)])[None].cuda())
        real = torch.ones_like(ids, dtype=torch.bool)
    else:
        ids, mask = _left_padded([113, 113] if inputs == "all real" else [113, 64])
        kwargs, real = dict(attention_mask=mask), mask.bool()
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(model, fullgraph=True)(input_ids=ids, **kwargs).logits.float()
    assert not [w for w in caught if FALLBACK_MARK in str(w.message)]
    if inputs != "position_ids":  # the torch peer; with a cache its mask does not read packing off position_ids,
        model.set_attn_implementation("sdpa")  # so packed rows keep our eager path as the bf16 peer
    with torch.no_grad():
        eager = model(input_ids=ids, **kwargs).logits.float()
        model.float()
        ref = model(input_ids=ids, **kwargs).logits
    err, half = (got - ref)[real].abs().max(), (eager - ref)[real].abs().max()
    assert err <= 2 * half + 1e-2, (err, half)


def test_reduce_overhead_mode_keeps_the_masked_op_out_of_cuda_graphs():
    """``torch.compile(mode="reduce-overhead")`` on a padded forward: the masked op reads a flag on the host, so
    inductor must not capture it in a CUDA graph (its ``cudagraph_unsafe`` tag). Three calls (warm-up, record,
    replay), each step marked and its logits cloned before the next replay overwrites the graph's output, as torch
    asks of a caller that keeps results: the same logits each time, within the oracle bound of the default-mode test
    above (twice eager bf16 sdpa's error of the fp32 model, plus a small floor: compiled and eager bf16 round
    differently, so a fixed fraction of the eager logits is no bound)."""
    model = tiny_llama("hfpatch")
    ids, mask = _left_padded([113, 64])
    compiled = torch.compile(model, mode="reduce-overhead")
    runs = []
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            torch.compiler.cudagraph_mark_step_begin()
            runs.append(compiled(input_ids=ids, attention_mask=mask).logits.clone())
    assert not [w for w in caught if FALLBACK_MARK in str(w.message)]
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        eager = model(input_ids=ids, attention_mask=mask).logits.float()
        model.float()
        ref = model(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    err, half = (runs[2].float() - ref)[real].abs().max(), (eager - ref)[real].abs().max()
    assert err <= 2 * half + 1e-2, (err, half)


KEY_RANGE_CASES = [
    # batch, cache len, S_q, heads, kv heads, head dim, window_left, softcap
    (4, 113, 1, 32, 8, 128, -1, 0.0),  # gqa
    (3, 1023, 1, 8, 8, 64, -1, 0.0),  # mha
    (2, 239, 2, 16, 1, 128, 50, 0.0),  # mqa, window, 2 query tokens
    (5, 4096, 1, 32, 8, 64, -1, 20.0),  # split-KV, softcap
    (3, 1, 1, 4, 2, 128, -1, 0.0),  # one key
]


@pytest.mark.parametrize("case", KEY_RANGE_CASES)
def test_decode_key_ranges_meet_the_oracle_bound(case):
    """The compiled decode step's kernel: row b sees keys [start_b, end_b) of a static cache (left padding,
    unwritten tail), its queries the last of them; error within twice a same-precision torch run."""
    from hf_flashpatch.api import decode_op

    from .test_decode import _check_against_oracle, _poison_allocator

    batch, cache_len, seqlen_q, heads, kv_heads, head_dim, window_left, softcap = case
    gen = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(batch, seqlen_q, heads, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(batch, kv_heads, cache_len, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(batch, kv_heads, cache_len, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = k.transpose(1, 2), v.transpose(1, 2)  # (B, S, H_kv, D) views of a transformers-layout cache
    ends = torch.randint(seqlen_q, cache_len + 1, (batch,), device="cuda", generator=gen).int()
    starts = (torch.rand(batch, device="cuda", generator=gen) * (ends - seqlen_q + 1).float()).int()
    scale = head_dim**-0.5
    _poison_allocator()
    out, lse = decode_op(q, k, v, ends, starts, softmax_scale=scale, softcap=softcap or None,
                         window_left=window_left, window_right=0)  # fmt: skip
    for b in range(batch):
        s, e = int(starts[b]), int(ends[b])
        _check_against_oracle(out[b : b + 1], lse[b : b + 1], q[b : b + 1], k[b : b + 1, s:e], v[b : b + 1, s:e],
                              [e - s], window_left, 0, softcap, scale)  # fmt: skip
