"""Benchmark part: a patched model under ``torch.compile`` against ``sdpa`` compiled the same way.

Panels (random Llama-1B-shaped bf16 models on the GPU, every series timed in this process):

- ``compiled static-cache generate``: 8 prompts x 512 tokens + 128 new tokens with
  ``cache_implementation="static"`` (transformers compiles the decode step with CUDA graphs); the second
  call is timed (new tokens/s), and the graph breaks / graphs of the first call are counted;
- ``compiled training step``: 4 layers, one 4k sequence, forward + backward with ``torch.compile(model)``
  (tokens/s), next to the same step uncompiled, so ``ours / sdpa`` can be compared compiled and not.
"""

from __future__ import annotations

import time

import torch
from bench_training import llama_1b, tokens_per_s

from hf_flashpatch import ATTN_NAME

SERIES = ("sdpa", ATTN_NAME)


def _dynamo_counts() -> tuple[int, int]:
    """(graph breaks, frames compiled) since the counters were last cleared."""
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values()), int(counters["frames"]["ok"])


def run_generate(results: list, quick: bool = False) -> None:
    """New tokens/s of compiled static-cache ``generate`` (second call), graph breaks of the first."""
    from torch._dynamo.utils import counters

    batch, prompt, new = (8, 512, 32 if quick else 128)
    layers = 4 if quick else 16
    for attn in SERIES:
        torch._dynamo.reset()
        counters.clear()
        model = llama_1b(layers, attn).eval()
        model.config.use_cache = True  # the training-shaped model turns the cache off
        model.generation_config.pad_token_id = 0
        ids = torch.randint(3, model.config.vocab_size, (batch, prompt), device="cuda")
        mask = torch.ones_like(ids)

        def generate():
            with torch.no_grad():
                return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                                      do_sample=False, cache_implementation="static", use_cache=True)  # fmt: skip

        t0 = time.perf_counter()
        generate()
        torch.cuda.synchronize()
        first_s = time.perf_counter() - t0
        breaks, graphs = _dynamo_counts()
        t0 = time.perf_counter()
        out = generate()
        torch.cuda.synchronize()
        tok_s = batch * (out.shape[1] - prompt) / (time.perf_counter() - t0)
        panel = f"compiled static-cache generate, {layers} layers, {batch}x{prompt}+{new}"
        results.append(dict(panel=panel, series=attn, x="new tokens/s", value=tok_s, unit="tokens/s"))
        results.append(dict(panel=panel, series=attn, x="graph breaks", value=breaks, unit="count"))
        results.append(dict(panel=panel, series=attn, x="frames compiled", value=graphs, unit="count"))
        results.append(dict(panel=panel, series=attn, x="first call s", value=first_s, unit="s"))
        del model
        torch.cuda.empty_cache()


def _step(model, ids) -> None:
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    for p in model.parameters():
        p.grad = None


def run_training(results: list, quick: bool = False) -> None:
    """Tokens/s of a forward + backward step, compiled and not, one 4k sequence."""
    from torch._dynamo.utils import counters

    seqlen, layers = 4096, 4
    panel = f"training step, {layers} layers, 1x{seqlen}"
    for attn in SERIES:
        model = llama_1b(layers, attn)
        ids = torch.randint(0, model.config.vocab_size, (1, seqlen), device="cuda")
        eager = tokens_per_s(lambda: _step(model, ids), seqlen)
        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(model)
        tok_s = tokens_per_s(lambda: _step(compiled, ids), seqlen, warmup=3)
        breaks, graphs = _dynamo_counts()
        results.append(dict(panel=panel, series=attn, x="eager tokens/s", value=eager, unit="tokens/s"))
        results.append(dict(panel=panel, series=attn, x="compiled tokens/s", value=tok_s, unit="tokens/s"))
        results.append(dict(panel=panel, series=attn, x="graph breaks", value=breaks, unit="count"))
        del model, compiled
        torch.cuda.empty_cache()


def run(results: list, quick: bool = False) -> None:
    for part in (run_generate, run_training):
        try:
            part(results, quick)
        except Exception as exc:  # one panel failing must not lose the other's numbers
            results.append(dict(panel=part.__name__, series="error", x="failed", value=None, unit="",
                                error=f"{type(exc).__name__}: {exc}"[:400]))  # fmt: skip
    _print_ratios(results)


def _print_ratios(results: list) -> None:
    """ours / sdpa for every measured quantity, and the compiled-vs-eager ratio of ratios."""
    values = {(r["panel"], r["series"], r["x"]): r["value"] for r in results if "x" in r and r.get("value") is not None}
    for (panel, series, x), value in sorted(values.items()):
        if series != ATTN_NAME or "tokens/s" not in x:
            continue
        peer = values.get((panel, "sdpa", x))
        if peer:
            print(f"{panel} | {x}: {ATTN_NAME}/sdpa = {value / peer:.3f}")
