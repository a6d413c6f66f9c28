"""Training through transformers with ``attn_implementation="hfpatch"``: the backward kernel in a real loop.

A tiny random Llama (GQA: 4 query / 2 KV heads, head_dim 64) with fp32 master weights under bf16
autocast is fine-tuned on a fixed synthetic token stream, once with ``sdpa`` and once with our backend,
from the same initial weights and batches; the two loss curves must agree closely. Then a few steps
under accelerate's bf16 mixed precision, and gradient checkpointing (same gradients as without it).
Each test checks that the backward kernel really ran (not the torch fallback).
"""

import copy

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("pycuda")
transformers = pytest.importorskip("transformers")

import hf_flashpatch  # noqa: E402
from hf_flashpatch.kernels import backward as bwd  # noqa: E402

STEPS, BATCH, SEQLEN, VOCAB = 50, 4, 256, 512
MAX_LOSS_GAP = 0.1  # nats, on losses from ~6.2 down; bf16 autocast noise between two correct implementations


@pytest.fixture
def kernel_calls(monkeypatch):
    calls = []
    real = bwd._kernel_backward
    monkeypatch.setattr(bwd, "_kernel_backward", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    return calls


def _tiny_llama(seed=0):
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, attention_dropout=0.0,
    )  # fmt: skip
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).cuda()


def _batches(n, seed=1):
    """A learnable stream: a fixed random bigram chain (next = perm[prev] with probability 0.9, else a
    random token), so the loss falls well within 50 steps."""
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(VOCAB, generator=gen)
    out = []
    for _ in range(n):
        rows = torch.empty(BATCH, SEQLEN, dtype=torch.long)  # (B, S)
        rows[:, 0] = torch.randint(0, VOCAB, (BATCH,), generator=gen)
        for pos in range(1, SEQLEN):
            jump = torch.rand(BATCH, generator=gen) < 0.1
            rows[:, pos] = torch.where(jump, torch.randint(0, VOCAB, (BATCH,), generator=gen), perm[rows[:, pos - 1]])
        out.append(rows.cuda())
    return out


def _train(model, attn, batches):
    model.set_attn_implementation(attn)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    losses = []
    for ids in batches:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def test_finetune_tracks_sdpa(kernel_calls):
    base = _tiny_llama()
    batches = _batches(STEPS)
    ref = _train(copy.deepcopy(base), "sdpa", batches)
    ours = _train(copy.deepcopy(base), hf_flashpatch.ATTN_NAME, batches)
    assert len(kernel_calls) >= STEPS * 2, "the backward kernel did not run in every layer and step"
    gap = max(abs(a - b) for a, b in zip(ref, ours))
    print(f"\nloss sdpa {ref[0]:.3f} -> {ref[-1]:.3f}, hfpatch {ours[0]:.3f} -> {ours[-1]:.3f}, max |diff| {gap:.4f}")
    assert ours[-1] < ours[0] - 0.5, f"loss did not fall: {ours[0]:.3f} -> {ours[-1]:.3f}"
    assert gap <= MAX_LOSS_GAP, f"loss curves differ by up to {gap:.4f} nats (sdpa {ref}, hfpatch {ours})"


def test_accelerate_bf16_mixed_precision(kernel_calls):
    accelerate = pytest.importorskip("accelerate")
    accelerator = accelerate.Accelerator(mixed_precision="bf16")
    model = _tiny_llama()
    model.set_attn_implementation(hf_flashpatch.ATTN_NAME)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    model, opt = accelerator.prepare(model, opt)
    losses = []
    for ids in _batches(6):
        loss = model(input_ids=ids, labels=ids).loss
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert kernel_calls, "the backward kernel did not run"
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0], losses


def test_gradient_checkpointing_same_gradients(kernel_calls):
    ids = _batches(1)[0]
    grads = []
    for checkpointing in (False, True):
        model = _tiny_llama()
        model.set_attn_implementation(hf_flashpatch.ATTN_NAME)
        model.config.use_cache = False
        if checkpointing:
            model.gradient_checkpointing_enable()
        model.train()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            model(input_ids=ids, labels=ids).loss.backward()
        grads.append({n: p.grad.float().clone() for n, p in model.named_parameters()})
    assert kernel_calls
    worst = max((grads[1][n] - g).norm().item() / max(g.norm().item(), 1e-12) for n, g in grads[0].items())
    print(f"\nmax relative gradient difference with/without checkpointing: {worst:.2e}")
    assert worst < 1e-2, f"checkpointed gradients differ by up to {worst:.2e} (relative norm)"
