"""Training speed of a Llama-3.2-1B-shaped model (random bf16 weights, built on the GPU): ``hfpatch`` against
``sdpa`` in forward + backward steps, on one sequence, on packed documents, and the longest sequence a checkpointed
step fits. Parts of ``scripts/bench_backward.py`` (its parts ``training`` and ``packed``, and ``--max-seqlen``); the
model and step helpers serve ``bench_compile.py`` and ``profile_training_step.py`` too.

Inputs: token ids ``(1, T)``; packed documents give position ids ``(1, T)`` restarting at 0 per document.
"""

from __future__ import annotations

import statistics
import time

import torch

TRAINING_ROUNDS = 3  # the fine-tune rows: each backend's steps timed in turns, a row the median of its rounds


def llama_1b(num_layers: int = 16, attn: str = "sdpa", checkpointing: bool = False):
    """Llama-3.2-1B shape with random bf16 weights, built on the GPU (no download)."""
    import transformers

    import hf_flashpatch  # noqa: F401  (registers the backend)

    config = transformers.LlamaConfig(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=num_layers,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
        rope_theta=500000.0, tie_word_embeddings=True, attention_dropout=0.0, use_cache=False,
    )  # fmt: skip
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = transformers.LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    model.set_attn_implementation(attn)
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable()
    return model


def train_step(model, seqlen: int) -> None:
    ids = torch.randint(0, model.config.vocab_size, (1, seqlen), device="cuda")
    model(input_ids=ids, labels=ids).loss.backward()
    for p in model.parameters():
        p.grad = None


def tokens_per_s(step, tokens: int, steps: int = 6, warmup: int = 2) -> float:
    """Tokens/s of ``step()`` (one forward + backward of ``tokens`` tokens): ``warmup`` untimed steps (kernel
    load, allocator), then ``steps`` timed ones between device syncs."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return steps * tokens / (time.perf_counter() - t0)


def run_training(results: list, quick: bool = False) -> None:
    """Tokens/s of forward + backward steps: ``sdpa`` (torch picks its kernel, as in a user's run),
    ``sdpa[flash]`` (the same model with SDPA held to its flash backend) and ``hfpatch``."""
    from contextlib import nullcontext

    from torch.nn.attention import SDPBackend, sdpa_kernel

    from hf_flashpatch import ATTN_NAME

    layers = 4 if quick else 16
    series = (("sdpa", "sdpa", nullcontext), ("sdpa[flash]", "sdpa", lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)),
              (ATTN_NAME, ATTN_NAME, nullcontext))  # fmt: skip
    models = {name: (llama_1b(layers, attn), context) for name, attn, context in series}  # the same initial weights
    panel = f"llama-1b-shape {layers} layers fwd+bwd"
    for seqlen in (4096, 16384):
        rounds: dict[str, list[float]] = {name: [] for name in models}
        for _ in range(TRAINING_ROUNDS):  # in turns, as the kernel rows (bench_timing): the same clock state for each
            for name, (model, context) in models.items():
                with context():
                    rounds[name].append(tokens_per_s(lambda: train_step(model, seqlen), seqlen))
        for name, values in rounds.items():
            results.append(dict(part="backward", panel=panel, series=name, seqlen=seqlen, head_dim=64, causal=True,
                                x=seqlen, value=statistics.median(values), unit="tokens/s"))  # fmt: skip
        ratios = [ours / theirs for ours, theirs in zip(rounds[ATTN_NAME], rounds["sdpa"])]
        results.append(dict(part="backward", panel=panel, series=f"{ATTN_NAME}/sdpa", seqlen=seqlen, head_dim=64,
                            causal=True, x=seqlen, value=statistics.median(ratios), spread=(min(ratios), max(ratios)),
                            unit="ratio"))  # fmt: skip
    del models
    torch.cuda.empty_cache()


def packed_documents(total: int, seed: int = 0) -> list[int]:
    """Lengths of documents (256-4096 tokens, a fixed draw) packed into one ``total``-token row."""
    generator = torch.Generator().manual_seed(seed)
    lengths: list[int] = []
    while sum(lengths) < total:
        lengths.append(min(int(torch.randint(256, 4097, (1,), generator=generator)), total - sum(lengths)))
    return lengths


def packed_step(model, ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """One forward + backward on documents packed in one row, as ``DataCollatorWithFlattening`` gives them:
    ids / position_ids ``(1, T)``, positions restarting at 0 per document, no attention mask. Returns the
    loss (a device tensor: no host sync inside timed steps)."""
    loss = model(input_ids=ids, position_ids=position_ids, labels=ids).loss
    loss.backward()
    for p in model.parameters():
        p.grad = None
    return loss.detach()


def run_training_packed(results: list, quick: bool = False) -> None:
    """Tokens/s of forward + backward on a 16k-token row of packed documents (long-context fine-tuning
    with ``DataCollatorWithFlattening``). transformers gives ``sdpa`` a block-diagonal mask built from the
    position ids (SDPA's flash and cuDNN kernels take no such mask, so torch picks another); ``hfpatch``
    reads the document starts from the position ids and runs its varlen kernels. The first step's loss is
    recorded per backend: all of them compute the same function, so the losses must agree."""
    from hf_flashpatch import ATTN_NAME

    layers = 4 if quick else 16
    total = 16384
    lengths = packed_documents(total)
    generator = torch.Generator(device="cuda").manual_seed(0)
    position_ids = torch.cat([torch.arange(n, device="cuda") for n in lengths])[None]  # (1, T)
    for attn in ("sdpa", ATTN_NAME):
        torch.manual_seed(0)  # same random weights for every backend
        model = llama_1b(layers, attn)
        try:
            ids = torch.randint(0, model.config.vocab_size, (1, total), device="cuda", generator=generator.manual_seed(0))
            loss = packed_step(model, ids, position_ids).item()  # same ids and weights for every backend
            tok_s = tokens_per_s(lambda: packed_step(model, ids, position_ids), total)
            results.append(dict(part="backward", panel=f"llama-1b-shape {layers} layers fwd+bwd, packed documents",
                                series=attn, seqlen=total, head_dim=64, causal=True, x=f"{total} ({len(lengths)} docs)",
                                value=tok_s, unit="tokens/s"))  # fmt: skip
            results.append(dict(part="backward", panel="packed documents: first-step loss (must agree)", series=attn,
                                x=f"{total} ({len(lengths)} docs)", value=loss, unit="nats"))  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - a backend that cannot run the packed batch is reported
            results.append(dict(part="backward", panel=f"llama-1b-shape {layers} layers fwd+bwd, packed documents",
                                series=attn, x=f"{total}", value=None, error=f"{type(exc).__name__}: {exc}"[:200]))  # fmt: skip
        del model
        torch.cuda.empty_cache()


def fits_in_memory(attn: str, seqlen: int) -> bool:
    model = None
    try:
        model = llama_1b(16, attn, checkpointing=True)
        train_step(model, seqlen)
        torch.cuda.synchronize()
        return True
    except torch.OutOfMemoryError:
        return False
    finally:
        del model
        torch.cuda.empty_cache()


def run_max_seqlen(results: list, limit: int = 160 * 1024, unit: int = 4096) -> None:
    """Binary search (multiples of ``unit``, up to ``limit``) of the longest sequence one checkpointed training
    step fits. With a 128k vocabulary the full logits (and their fp32 loss) take ~10 bytes x 128k per
    token, so the LM head, not attention, may set the limit for both implementations. A result equal to
    ``limit`` means "at least"."""
    from hf_flashpatch import ATTN_NAME

    for attn in ("sdpa", ATTN_NAME):
        lo, hi = 0, limit // unit  # in units; lo fits (0 trivially), hi is the search cap
        t0 = time.perf_counter()
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits_in_memory(attn, mid * unit):
                lo = mid
            else:
                hi = mid - 1
        results.append(dict(part="backward", panel="max seqlen, llama-1b-shape + grad checkpointing", series=attn,
                            seqlen=lo * unit, head_dim=64, causal=True, x=0, value=float(lo * unit), unit="tokens",
                            search_cap=limit, search_s=time.perf_counter() - t0))  # fmt: skip
