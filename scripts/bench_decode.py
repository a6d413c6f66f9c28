"""Decode benchmark: bytes of K+V read per second, ours vs torch SDPA, plus end-to-end continuous batching.

    python scripts/bench_decode.py [--quick] [--rounds N] [--only kernels|head-dim-80|mla|generate]

Kernel part: GQA 32/8, head dim 128, bf16, one query token per sequence, at batch x context
64x4096, 16x32768, 128x2048. Contenders: our decode over a contiguous cache, our paged decode (page
size 16 and 256, pages shuffled in the pool), SDPA's flash and cuDNN backends on the contiguous cache.
TB/s = bytes of K and V read (2 * B * L * H_kv * D * 2) / time; each call is timed inside a CUDA graph
(10 calls per replay) so host overhead is not measured; every contender is timed once per pass, in at
least 3 interleaved passes, and the median is reported (with the spread). The HBM read ceiling (a ``.sum()`` over 4 GB
of bf16) is measured in the same run. Ratios are vs SDPA cuDNN.

Head dim 80 part: Phi-2's decode (32 heads of 80, one K/V head each) at 16x4096 and 64x2048: our decode kernels
built at 80 (contiguous, paged 16) vs SDPA's flash and cuDNN backends; ratios vs cuDNN.

Multi-head latent attention part: DeepSeek-V3's decode (128 heads, K/V per head as transformers' cache holds them,
q/k head dim 192, v 128) at 8x4096, 32x1024 and 1x32768: our decode kernel (which reads v at 128 columns) vs
SDPA's efficient and cuDNN backends (flash takes one head dim), bytes = B * L * H * (192 + 128) * 2; the ratio
is vs the faster SDPA backend that ran.

Eager ``generate`` part: new tokens/s of a plain eager dynamic-cache ``generate`` (8 layers, batch 1 and 8,
256 + 128 tokens), ``sdpa`` vs ours: the host time per attention call shows here.

End-to-end part: tokens/s of ``model.generate_batch`` on a random Llama-shaped model (8 layers,
hidden 2048, 32/8 heads). transformers < 5.19: ``paged|hfpatch`` vs ``paged|sdpa``. transformers >= 5.19:
``hfpatch`` (decode steps on the block-table path: kv_append + paged decode kernels) vs ``sdpa``, plus
``hfpatch`` with the block-table path turned off (``max_blocks_per_request=0``: every step gathers the
cache and runs varlen), so the fast path's gain is measured in the same run. Each contender first runs
a short warm-up batch (kernel builds), then the timed one. Skipped when the model has no ``generate_batch``.

``run(results, quick)`` appends one dict per measurement (the ``scripts/bench.py`` protocol).
"""

from __future__ import annotations

import argparse
import time

import torch

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
SHAPES = [(64, 4096), (16, 32768), (128, 2048)]
PHI2_HEADS, PHI2_HEAD_DIM, PHI2_SHAPES = 32, 80, [(16, 4096), (64, 2048)]  # Phi-2: 32 heads of 80, MHA
MLA_HEADS, MLA_DIMS = 128, (192, 128)  # DeepSeek-V3: heads, (q/k head dim, v head dim)
MLA_SHAPES = [(8, 4096), (32, 1024), (1, 32768)]
CALLS_PER_GRAPH = 10


def _graph_time_us(fn, replays: int) -> float:
    """Mean time of one ``fn()`` call, from a CUDA graph of CALLS_PER_GRAPH calls replayed ``replays`` times."""
    fn()  # compile / load / autotune outside the capture
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(CALLS_PER_GRAPH):
                fn()
    torch.cuda.current_stream().wait_stream(side)
    graph.replay()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) * 1000.0 / (replays * CALLS_PER_GRAPH)


def hbm_read_ceiling_tbs(replays: int) -> float:
    x = torch.ones(2 << 30, device="cuda", dtype=torch.bfloat16)  # 4 GB
    us = _graph_time_us(lambda: x.sum(dtype=torch.float32), replays)
    return x.numel() * 2 / (us * 1e-6) / 1e12


def _paged_copy(k, v, page_size, generator, shuffled: bool = True):
    """The contiguous caches (B, L, H_kv, D) scattered over a shuffled pool of pages (or laid out in
    order: sequence b's pages are b * pages_per_seq + 0, 1, ..., the best case for address translation)."""
    batch, length = k.shape[:2]
    pages_per_seq = length // page_size
    if shuffled:
        order = torch.randperm(batch * pages_per_seq, generator=generator)
    else:
        order = torch.arange(batch * pages_per_seq)
    order = order.view(batch, pages_per_seq).cuda()
    kv_heads, head_dim = k.shape[2:]
    shape = (batch * pages_per_seq, page_size, kv_heads, head_dim)
    k_pages, v_pages = torch.empty(shape, device="cuda", dtype=k.dtype), torch.empty(shape, device="cuda", dtype=k.dtype)
    k_pages[order] = k.view(batch, pages_per_seq, page_size, kv_heads, head_dim)
    v_pages[order] = v.view(batch, pages_per_seq, page_size, kv_heads, head_dim)
    return k_pages, v_pages, order.to(torch.int32)


def _sdpa(backend, q, k, v):
    from torch.nn.attention import sdpa_kernel

    q_t, k_t, v_t = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, S, D) views

    def call():
        with sdpa_kernel([backend]):
            return torch.nn.functional.scaled_dot_product_attention(q_t, k_t, v_t, enable_gqa=True)

    return call


def _our_forms(batch: int, length: int, generator: torch.Generator, in_order_pages: bool = False,
               heads: int = HEADS, kv_heads: int = KV_HEADS, head_dim: int = HEAD_DIM):
    """Random inputs of one shape and our three decode forms on them: returns q ``(B, 1, H, D)``,
    k / v ``(B, L, H_kv, D)`` views of ``(B, H_kv, L, D)`` storage (as the transformers cache holds
    them), the K+V byte count, and ``{"contiguous" | "paged 16" | "paged 256": call}`` (shuffled
    pages), plus ``"paged 16 in order"`` when ``in_order_pages``."""
    from hf_flashpatch.kernels import decode

    common = dict(causal=True, softmax_scale=None, window_left=-1, window_right=0, softcap=0.0)
    q = torch.randn(batch, 1, heads, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, kv_heads, length, head_dim, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    v = torch.randn(batch, kv_heads, length, head_dim, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    seqlens = torch.full((batch,), length, device="cuda", dtype=torch.int32)
    kv_bytes = 2 * batch * length * kv_heads * head_dim * 2
    forms = {"contiguous": lambda: decode.decode_forward(q, k, v, None, **common)}
    for page_size in (16, 256):
        k_pages, v_pages, table = _paged_copy(k.contiguous(), v.contiguous(), page_size, generator)
        forms[f"paged {page_size}"] = (
            lambda kp=k_pages, vp=v_pages, t=table: decode.paged_decode_forward(q, kp, vp, t, seqlens, **common)
        )
    if in_order_pages:
        k_pages, v_pages, table = _paged_copy(k.contiguous(), v.contiguous(), 16, generator, shuffled=False)
        forms["paged 16 in order"] = lambda: decode.paged_decode_forward(q, k_pages, v_pages, table, seqlens, **common)
    return q, k, v, kv_bytes, forms


def _time_contenders(contenders: dict, reference: torch.Tensor, kv_bytes: int, batch: int, length: int, replays: int,
                     rounds: int) -> tuple[dict, dict, dict]:  # fmt: skip
    """``(median TB/s, max error vs reference, samples)`` per contender; reference ``(B, 1, H, D_v)`` fp32."""
    error, samples = {}, {}
    for name, fn in contenders.items():
        try:
            result = fn()
            out = result[0] if name.startswith("ours") else result.transpose(1, 2)
            error[name] = (out.float() - reference).abs().max().item()  # sanity: same answer as SDPA math
        except Exception as exc:  # noqa: BLE001 - a peer backend that refuses the shape is reported, not fatal
            print(f"{name} at {batch}x{length}: {type(exc).__name__}: {str(exc)[:200]}")
            error[name] = float("nan")
    # Interleaved passes (every contender once per pass), median per contender: clock or thermal
    # drift between passes moves every contender alike instead of favouring whoever ran first.
    for _ in range(rounds):
        for name, fn in contenders.items():
            if error[name] == error[name]:  # not NaN: it ran above
                samples.setdefault(name, []).append(kv_bytes / (_graph_time_us(fn, replays) * 1e-6) / 1e12)
    row = {name: sorted(samples[name])[len(samples[name]) // 2] if name in samples else float("nan")
           for name in contenders}  # fmt: skip
    return row, error, samples


def value_head_dim_rows(results: list, quick: bool, rounds: int = 3) -> None:
    """DeepSeek-V3's decode (module docstring): ours at q/k 192, v 128 vs SDPA's backends that take the pair."""
    from torch.nn.attention import SDPBackend

    from hf_flashpatch.kernels import decode

    replays = 5 if quick else 20
    head_dim, head_dim_v = MLA_DIMS
    common = dict(causal=True, softmax_scale=None, window_left=-1, window_right=0, softcap=0.0)
    for batch, length in MLA_SHAPES[:2] if quick else MLA_SHAPES:
        q = torch.randn(batch, 1, MLA_HEADS, head_dim, device="cuda", dtype=torch.bfloat16)  # (B, 1, H, D)
        k = torch.randn(batch, MLA_HEADS, length, head_dim, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        v = torch.randn(batch, MLA_HEADS, length, head_dim_v, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        kv_bytes = batch * length * MLA_HEADS * (head_dim + head_dim_v) * 2
        contenders = {
            "ours mla contiguous": lambda: decode.decode_forward(q, k, v, None, **common),
            "sdpa efficient mla": _sdpa(SDPBackend.EFFICIENT_ATTENTION, q, k, v),
            "sdpa cudnn mla": _sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v),
        }
        reference = _sdpa(SDPBackend.MATH, q, k, v)().transpose(1, 2).float()  # (B, 1, H, D_v)
        row, error, samples = _time_contenders(contenders, reference, kv_bytes, batch, length, replays, rounds)
        best_peer = max((tbs for name, tbs in row.items() if name.startswith("sdpa") and tbs == tbs), default=float("nan"))
        for name, tbs in row.items():
            results.append({
                "name": name, "series": name, "panel": f"decode TB/s (MLA {MLA_HEADS} heads, {head_dim}/{head_dim_v}, "
                "bf16)", "x": f"{batch}x{length}", "value": tbs, "unit": "TB/s", "vs_cudnn": tbs / best_peer,
                "max_abs_err_vs_sdpa_math": error[name], "rounds": len(samples.get(name, [])),
            })  # fmt: skip
        del q, k, v, contenders


def head_dim_80_rows(results: list, quick: bool, rounds: int = 3) -> None:
    """Phi-2's decode (module docstring): our decode kernels built at head dim 80 vs SDPA's flash and cuDNN."""
    from torch.nn.attention import SDPBackend

    replays = 5 if quick else 20
    generator = torch.Generator().manual_seed(0)
    for batch, length in PHI2_SHAPES[:1] if quick else PHI2_SHAPES:
        q, k, v, kv_bytes, forms = _our_forms(batch, length, generator, heads=PHI2_HEADS, kv_heads=PHI2_HEADS,
                                              head_dim=PHI2_HEAD_DIM)  # fmt: skip
        contenders = {
            "ours d80 contiguous": forms["contiguous"],
            "ours d80 paged 16": forms["paged 16"],
            "sdpa flash d80": _sdpa(SDPBackend.FLASH_ATTENTION, q, k, v),
            "sdpa cudnn d80": _sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v),
        }
        reference = _sdpa(SDPBackend.MATH, q, k, v)().transpose(1, 2).float()  # (B, 1, H, D)
        row, error, samples = _time_contenders(contenders, reference, kv_bytes, batch, length, replays, rounds)
        for name, tbs in row.items():
            results.append({
                "name": name, "series": name, "panel": f"decode TB/s (MHA {PHI2_HEADS}, D={PHI2_HEAD_DIM}, bf16)",
                "x": f"{batch}x{length}", "value": tbs, "unit": "TB/s", "vs_cudnn": tbs / row["sdpa cudnn d80"],
                "max_abs_err_vs_sdpa_math": error[name], "rounds": len(samples.get(name, [])),
            })  # fmt: skip
        del q, k, v, contenders, forms


def kernel_rows(results: list, quick: bool, rounds: int = 3) -> None:
    from torch.nn.attention import SDPBackend

    replays = 5 if quick else 20
    ceiling = hbm_read_ceiling_tbs(replays)
    results.append({"name": "hbm_read_ceiling", "series": "HBM read (sum)", "value": ceiling, "unit": "TB/s"})
    generator = torch.Generator().manual_seed(0)
    for batch, length in SHAPES:
        q, k, v, kv_bytes, forms = _our_forms(batch, length, generator)
        contenders = {
            "ours contiguous": forms["contiguous"],
            "sdpa flash": _sdpa(SDPBackend.FLASH_ATTENTION, q, k, v),
            "sdpa cudnn": _sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v),
            "ours paged 16": forms["paged 16"],
            "ours paged 256": forms["paged 256"],
        }
        reference = _sdpa(SDPBackend.MATH, q, k, v)().transpose(1, 2).float()  # (B, 1, H, D)
        row, error, samples = _time_contenders(contenders, reference, kv_bytes, batch, length, replays, rounds)
        for name, tbs in row.items():
            results.append({
                "name": name, "series": name, "panel": "decode TB/s (GQA 32/8, D=128, bf16)", "x": f"{batch}x{length}",
                "value": tbs, "unit": "TB/s", "vs_cudnn": tbs / row["sdpa cudnn"], "vs_hbm_ceiling": tbs / ceiling,
                "max_abs_err_vs_sdpa_math": error[name], "rounds": len(samples.get(name, [])),
                "spread": max(samples.get(name, [tbs])) - min(samples.get(name, [tbs])),
            })  # fmt: skip
        del q, k, v, contenders, forms


def _random_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=8, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=4096,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device("cuda"):  # initialise on the GPU: seconds instead of a minute on the host
        return LlamaForCausalLM(config).to(torch.bfloat16).eval()


def _generate_contenders(newest: bool) -> list[tuple[str, str, dict]]:
    """(row label, attention name, ContinuousBatchingConfig overrides) per contender."""
    import hf_flashpatch

    ours = hf_flashpatch.ATTN_NAME
    if not newest:  # continuous batching calls paged|<name>
        return [("paged|sdpa", "paged|sdpa", {}), (f"paged|{ours}", f"paged|{ours}", {})]
    keep = dict(auto_switch_to_flash=False)  # "sdpa" stays sdpa where flash-attn is installed
    return [
        ("sdpa", "sdpa", keep),
        (f"{ours} block table", ours, keep),
        (f"{ours} gathered", ours, dict(keep, max_blocks_per_request=0)),
    ]


def generate_rows(results: list, quick: bool) -> None:
    import transformers
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    from hf_flashpatch.backend.patch import _paged_prefix_supported

    model = _random_llama()
    if not hasattr(model, "generate_batch"):
        print("generate_batch part skipped: no generate_batch")
        return
    newest = not _paged_prefix_supported()  # transformers >= 5.19: no paged| functions
    num_prompts, prompt_len, new_tokens = (32, 128, 64) if quick else (128, 256, 256)
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 32000, (prompt_len,), generator=generator).tolist() for _ in range(num_prompts)]
    config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    warmup = GenerationConfig(max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
    for label, attn, overrides in _generate_contenders(newest):
        model.set_attn_implementation(attn)
        batching = ContinuousBatchingConfig(**overrides)
        # No inference_mode here: the batching thread updates tensors the manager creates.
        model.generate_batch(inputs=prompts[:4], generation_config=warmup, continuous_batching_config=batching)
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = model.generate_batch(inputs=prompts, generation_config=config, continuous_batching_config=batching)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        tokens = sum(len(r.generated_tokens) for r in out.values())
        results.append({
            "name": f"generate_batch {label}", "series": label, "panel": "generate_batch tokens/s",
            "x": f"{num_prompts}x({prompt_len}+{new_tokens})", "value": tokens / seconds, "unit": "tok/s",
            "transformers": transformers.__version__,
        })  # fmt: skip


def eager_generate_rows(results: list, quick: bool) -> None:
    """New tokens/s of plain eager ``generate`` (dynamic cache, ``inference_mode``, unpadded prompts), where
    the host time of every attention call counts: ``sdpa`` vs ours on the same model, best of 2 calls."""
    import hf_flashpatch

    model = _random_llama()
    prompt_len, new_tokens = (128, 32) if quick else (256, 128)
    for batch in (1, 8):
        ids = torch.randint(3, 32000, (batch, prompt_len), device="cuda")
        for attn in ("sdpa", hf_flashpatch.ATTN_NAME):
            model.set_attn_implementation(attn)
            best = 0.0
            for _ in range(2):  # the first call also builds kernels
                torch.cuda.synchronize()
                start = time.perf_counter()
                with torch.inference_mode():
                    out = model.generate(
                        input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0,
                        max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                    )  # fmt: skip
                torch.cuda.synchronize()
                best = max(best, batch * (out.shape[1] - prompt_len) / (time.perf_counter() - start))
            results.append({
                "name": f"eager generate {attn}", "series": attn, "panel": "eager generate new tokens/s",
                "x": f"{batch}x({prompt_len}+{new_tokens})", "value": best, "unit": "tok/s",
            })  # fmt: skip
            print(f"eager generate {attn:8s} batch {batch}: {best:8.1f} new tok/s")


PARTS = ("kernels", "head-dim-80", "mla", "generate")


def run(results: list, quick: bool = False, rounds: int = 3, parts: tuple[str, ...] = PARTS) -> None:
    rounds = max(rounds, 3)
    if "kernels" in parts:
        kernel_rows(results, quick, rounds=rounds)
    if "head-dim-80" in parts:
        head_dim_80_rows(results, quick, rounds=rounds)
    if "mla" in parts:
        value_head_dim_rows(results, quick, rounds=rounds)
    if "generate" in parts:
        eager_generate_rows(results, quick)
        try:
            generate_rows(results, quick)
        except Exception as exc:  # noqa: BLE001 - the kernel numbers above stand on their own
            print(f"generate_batch part failed: {type(exc).__name__}: {exc}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing passes (median; at least 3)")
    parser.add_argument("--only", choices=PARTS, action="append", help="run only this part (repeatable)")
    args = parser.parse_args()
    results: list[dict] = []
    run(results, quick=args.quick, rounds=args.rounds, parts=tuple(args.only or PARTS))
    print(f"{'name':<34} {'shape':<12} {'value':>9}  unit   vs cuDNN  vs HBM  max err")
    for r in results:
        ratio = f"{r['vs_cudnn']:.2f}" if "vs_cudnn" in r else ""
        ceil = f"{r['vs_hbm_ceiling']:.2f}" if "vs_hbm_ceiling" in r else ""
        err_key = "max_abs_err_vs_sdpa_math" if "max_abs_err_vs_sdpa_math" in r else None
        err = f"{r[err_key]:.1e}" if err_key else ""
        print(f"{r['name']:<34} {r.get('x', ''):<12} {r['value']:9.3f}  {r['unit']:<6} {ratio:>7}  {ceil:>6}  {err}")


if __name__ == "__main__":
    main()
