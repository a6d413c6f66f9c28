"""Host time per call of the public API on CUDA (the launch overhead an eager decode loop pays per layer).

    python scripts/profile_host.py [--calls 300] [--top 18] [--generate | --training]

Tiny shapes (GQA 32/8, d128, batch 8, 1k keys; a 1 x 128 forward) so that the GPU never holds the host
back: the wall time of ``--calls`` calls without synchronising, divided by the calls, is what the Python
side costs. Each API form is timed with the default table checks and with ``check_inputs=False``,
next to torch SDPA on the same tensors (a peer in the same run); then cProfile lists where the time of
the paged decode call goes. ``--generate`` profiles a plain eager ``generate`` instead (the random
8-layer Llama of ``bench_decode``, batch 1, 256 + 64 tokens), ``sdpa`` and ours, sorted by own time.
``--training`` times the host side of a training call instead: one forward + backward of the attention (GQA 32/8,
d64, 1 x 128, causal) through the API and through SDPA, and one step of the 4-layer Llama-3.2-1B-shaped model of
``bench_training`` at 128 tokens per backend (host-bound: the step's wall is its host time), then cProfile of the
API's forward + backward. Its rows after the totals time the call's pieces (the forward without and with grad, the
forward's launch, the backward's kernel body and its whole body, one launch, a no-op autograd Function of the same
tensors, SDPA's forward) and then the timeline: each function of the call timed where it runs, the backward's on
autograd's device thread included.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch
import torch.nn.functional as F

import hf_flashpatch as hfp


def _host_us(fn, calls: int) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    return host * 1e6 / calls


def profile_generate(top: int) -> None:
    from bench_decode import _random_llama  # this script's folder is on sys.path

    model = _random_llama()
    ids = torch.randint(3, 32000, (1, 256), device="cuda")

    def generate():
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0,
                           max_new_tokens=64, min_new_tokens=64)  # fmt: skip
        torch.cuda.synchronize()

    for attn in ("sdpa", hfp.ATTN_NAME):
        model.set_attn_implementation(attn)
        generate()  # kernel builds, warm caches
        start = time.perf_counter()
        generate()
        print(f"\n=== {attn}: {(time.perf_counter() - start) / 64 * 1e3:.2f} ms per new token")
        profiler = cProfile.Profile()
        profiler.enable()
        generate()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(top)


def profile_training(calls: int, top: int) -> None:
    from bench_training import llama_1b, train_step  # this script's folder is on sys.path

    dev, dt = "cuda", torch.bfloat16
    q, k, v = (torch.randn(1, 128, h, 64, device=dev, dtype=dt, requires_grad=True) for h in (32, 8, 8))  # (B, S, H, D)
    grad = torch.randn(1, 128, 32, 64, device=dev, dtype=dt)
    sdpa_q, sdpa_k, sdpa_v = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))  # (B, H, S, D)

    def ours():
        hfp.flash_attn_func(q, k, v, causal=True).backward(grad)

    def sdpa():
        F.scaled_dot_product_attention(sdpa_q, sdpa_k, sdpa_v, is_causal=True, enable_gqa=True).backward(
            grad.transpose(1, 2))

    rows = [("flash_attn_func fwd+bwd 1x128 causal", _host_us(ours, calls)),
            ("torch sdpa fwd+bwd (peer)", _host_us(sdpa, calls))]  # fmt: skip
    rows += _training_parts(q, k, v, grad, sdpa_q, sdpa_k, sdpa_v, calls)
    rows += _training_timeline(q, k, v, grad, calls)
    for attn in ("sdpa", hfp.ATTN_NAME):
        model = llama_1b(4, attn)
        step_us = _host_us(lambda: train_step(model, 128), max(calls // 20, 5))
        rows.append((f"4-layer step at 128 tokens, {attn}", step_us))
        del model
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        ours()
    profiler.disable()
    torch.cuda.synchronize()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(top)
    print(f"{'form':40s} {'host us/call':>12s}")
    for name, us in rows:
        print(f"{name:40s} {us:12.1f}")


def _training_timeline(q, k, v, grad, calls: int) -> list[tuple[str, float]]:
    """Inclusive host time per call of the functions a training call runs, by wrapping each where its callers look it
    up (module globals, class attributes), so the backward's, which the autograd engine runs on its device thread,
    are timed where they run; and the engine's own time around the backward's body (the call's ``.backward()`` less
    the body)."""
    from hf_flashpatch import api
    from hf_flashpatch.kernels import backward, build, forward, tma

    spent: dict[str, float] = {}
    targets = [(api, "_kernel_call"), (api, "_finish"), (api, "check_qkv"), (api, "check_scalars"),
               (forward, "_launch"), (forward, "_check_supported"), (forward, "needs_padding"),
               (forward, "kv_maps"), (forward, "output_map"), (forward, "query_map"), (forward, "packed_rows_map"),
               (forward, "get_kernel"), (forward.ForwardConfig, "for_problem"), (forward, "chain_form"),
               (forward, "_split_tail"), (forward, "device_arch"),
               (backward, "_backward_fn"), (backward, "_backward_impl"), (backward, "check_supported"),
               (backward, "_kernel_backward"), (backward, "_tensor_maps"), (backward, "get_kernel"),
               (backward.BackwardConfig, "build"), (tma, "descriptor"), (tma, "stats_descriptor"),
               (tma, "reduce_descriptor"), (build.Kernel, "pack"), (build.Kernel, "launch")]  # fmt: skip
    originals = []

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - start
        return wrapper

    for owner, attr in targets:
        fn = owner.__dict__[attr]
        originals.append((owner, attr, fn))
        name = f"{owner.__name__.rsplit('.', 1)[-1]}.{attr}"
        wrapped = timed(name, fn.__func__ if isinstance(fn, (staticmethod, classmethod)) else fn)
        setattr(owner, attr, classmethod(wrapped) if isinstance(fn, classmethod) else wrapped)
    try:
        for _ in range(5):
            hfp.flash_attn_func(q, k, v, causal=True).backward(grad)
        torch.cuda.synchronize()
        spent.clear()
        forward_s = backward_s = 0.0
        for _ in range(calls):
            start = time.perf_counter()
            out = hfp.flash_attn_func(q, k, v, causal=True)
            middle = time.perf_counter()
            out.backward(grad)
            forward_s += middle - start
            backward_s += time.perf_counter() - middle
        torch.cuda.synchronize()
    finally:
        for owner, attr, fn in originals:
            setattr(owner, attr, fn)
    rows = [("timeline: flash_attn_func (forward)", forward_s), ("timeline: .backward()", backward_s),
            ("timeline: .backward() less its body", backward_s - spent.get("backward._backward_fn", 0.0))]  # fmt: skip
    rows += [(f"  {name}", total) for name, total in spent.items()]
    return [(name, total * 1e6 / calls) for name, total in rows]


def _training_parts(q, k, v, grad, sdpa_q, sdpa_k, sdpa_v, calls: int) -> list[tuple[str, float]]:
    """Host time of the pieces of one training call (the rows after the two totals)."""
    from hf_flashpatch.kernels import backward, build, forward

    causal = dict(causal=True)
    with torch.no_grad():
        out, lse = forward.attention_forward(q, k, v, softmax_scale=None, window_left=-1, window_right=-1,
                                             softcap=None, **causal)  # fmt: skip
    cfg = backward.check_supported(q, k, v, 0.0)
    scale = q.shape[-1] ** -0.5
    convert = build.get_kernel(cfg.build(), "bwd_convert_dq", q.device)
    accum = torch.zeros(1, 1, 128, 64, device=q.device)  # (B, H, rows, D) fp32, one tiny launch's workspace
    dq = torch.empty(1, 128, 1, 64, device=q.device, dtype=q.dtype)

    def forward_no_grad():
        with torch.no_grad():
            hfp.flash_attn_func(q, k, v, causal=True)

    def sdpa_no_grad():
        with torch.no_grad():
            F.scaled_dot_product_attention(sdpa_q, sdpa_k, sdpa_v, is_causal=True, enable_gqa=True)

    grads = (torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v))

    class NoOpAttention(torch.autograd.Function):  # the engine's own cost for a Python Function of these tensors
        @staticmethod
        def forward(ctx, q, k, v):
            ctx.save_for_backward(q, k, v)
            return out.clone()

        @staticmethod
        def backward(ctx, dout):
            return grads

    saved = (q.detach(), k.detach(), v.detach(), out, lse, None, None)
    ctx = type("Ctx", (), {"saved_tensors": saved, "attrs": (128, 128, scale, -1, 0, 0.0, False)})()

    def backward_fn():
        with torch.no_grad():
            backward._backward_fn(ctx, grad, None)

    parts = {
        "  no-op Function fwd+bwd": lambda: NoOpAttention.apply(q, k, v).backward(grad),
        "  backward._backward_fn, no grad": backward_fn,
        "  fwd, no grad": forward_no_grad,
        "  fwd with grad, graph dropped": lambda: hfp.flash_attn_func(q, k, v, causal=True),
        "  forward._launch": lambda: forward._launch(q, k, v, None, None, 0, 0, scale, True, -1, -1, 0.0),
        "  backward._kernel_backward": lambda: backward._kernel_backward(
            cfg, grad, q, k, v, out, lse, None, None, None, 128, 128, scale, -1, 0, 0.0, False),
        "  one launch (pack + launch)": lambda: convert((1, 1, 1), (256, 1, 1), accum, dq, 1, 128, 128, 1.0,
                                                        tensors=(accum, dq)),  # fmt: skip
        "  torch.empty on cuda": lambda: torch.empty(2, 1, 32, 256, device=q.device),
        "  get_device_capability": lambda: torch.cuda.get_device_capability(q.device),
        "  sdpa fwd, no grad (peer)": sdpa_no_grad,
        "  sdpa fwd with grad (peer)": lambda: F.scaled_dot_product_attention(sdpa_q, sdpa_k, sdpa_v, is_causal=True,
                                                                              enable_gqa=True),  # fmt: skip
    }
    return [(name, _host_us(fn, calls)) for name, fn in parts.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--top", type=int, default=18)
    parser.add_argument("--generate", action="store_true")
    parser.add_argument("--training", action="store_true")
    args = parser.parse_args()
    if args.generate:
        return profile_generate(args.top)
    if args.training:
        return profile_training(args.calls, args.top)
    dev, dt = "cuda", torch.bfloat16
    batch, length, page = 8, 1024, 16
    q = torch.randn(batch, 1, 32, 128, device=dev, dtype=dt)  # (B, 1, H, D)
    k = torch.randn(batch, length, 8, 128, device=dev, dtype=dt)  # (B, S_cache, H_kv, D)
    v = torch.randn_like(k)
    lens = torch.full((batch,), length, dtype=torch.int32, device=dev)
    k_pages = k.reshape(batch * length // page, page, 8, 128)  # (num_pages, page, H_kv, D), in order
    v_pages = v.reshape(batch * length // page, page, 8, 128)
    table = torch.arange(batch * length // page, dtype=torch.int32, device=dev).view(batch, -1)  # (B, pages)
    fq, fk, fv = (torch.randn(1, 128, 32, 128, device=dev, dtype=dt) for _ in range(3))  # (B, S, H, D)
    sdpa_q, sdpa_k, sdpa_v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, S, D)
    forms = {
        "with_kvcache": lambda: hfp.flash_attn_with_kvcache(q, k, v, lens),
        "with_kvcache check_inputs=False": lambda: hfp.flash_attn_with_kvcache(q, k, v, lens, check_inputs=False),
        "paged_decode": lambda: hfp.flash_attn_paged_decode(q, k_pages, v_pages, table, lens),
        "paged_decode check_inputs=False": lambda: hfp.flash_attn_paged_decode(
            q, k_pages, v_pages, table, lens, check_inputs=False),
        "flash_attn_func 1x128 causal": lambda: hfp.flash_attn_func(fq, fk, fv, causal=True),
        "torch sdpa decode (peer)": lambda: F.scaled_dot_product_attention(sdpa_q, sdpa_k, sdpa_v, enable_gqa=True),
    }  # fmt: skip
    rows = [(name, _host_us(fn, args.calls)) for name, fn in forms.items()]
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(args.calls):
        forms["paged_decode"]()
    profiler.disable()
    torch.cuda.synchronize()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(args.top)
    print(f"{'form':36s} {'host us/call':>12s}")
    for name, us in rows:
        print(f"{name:36s} {us:12.1f}")


if __name__ == "__main__":
    main()
