"""Host time per call of the public API on CUDA (the launch overhead an eager decode loop pays per layer).

    python scripts/profile_host.py [--calls 300] [--top 18] [--generate]

Tiny shapes (GQA 32/8, d128, batch 8, 1k keys; a 1 x 128 forward) so that the GPU never holds the host
back: the wall time of ``--calls`` calls without synchronising, divided by the calls, is what the Python
side costs. Each API form is timed with the default table checks and with ``check_inputs=False``,
next to torch SDPA on the same tensors (a peer in the same run); then cProfile lists where the time of
the paged decode call goes. ``--generate`` profiles a plain eager ``generate`` instead (the random
8-layer Llama of ``bench_decode``, batch 1, 256 + 64 tokens), ``sdpa`` and ours, sorted by own time.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--top", type=int, default=18)
    parser.add_argument("--generate", action="store_true")
    args = parser.parse_args()
    if args.generate:
        return profile_generate(args.top)
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
