"""Forward attention throughput: our kernel against torch SDPA (flash, cuDNN) and FlexAttention.

    python scripts/bench_forward.py [--quick] [--sweep]

FlashAttention's benchmark configuration: 16k tokens per batch (batch = 16384 // seqlen), hidden
2048 (heads = 2048 // head_dim), bf16, seqlens 512..16k, head dims 64 and 128, causal and not.
Tensors are ``(B, S, H, D)``; the peers get ``transpose(1, 2)`` views of the same memory.
TFLOP/s = 4 * B * H * S^2 * D / time (halved for causal); the implementations of a shape are timed in turns,
``bench_timing.ROUNDS`` rounds (each the median of ``triton.testing.do_bench``), and a row is the median of its
rounds; a ratio row is the median of the per-round ratios, its range printed beside it. ``run(results, quick)``
appends one dict per (implementation, shape) for ``scripts/bench.py``; ``--sweep`` also times the alternative tile
shapes of :data:`CANDIDATE_SHAPES` (passed to the kernel layer explicitly: nothing selects kernels by environment).

Multi-head latent attention (DeepSeek-V3: q/k head dim 192, v head dim 128, :data:`MLA_DIMS`): ours is the
public ``flash_attn_func`` (on Hopper the native 192/128 kernel, elsewhere zero-padding to head dim 256,
``hf_flashpatch/kernels/value_head_dim.py``, whose copies are timed too), against torch's SDPA on the same tensors with the backend torch picks
itself (flash takes one head dim only). TFLOP/s = 2 * B * H * S^2 * (192 + 128) / time (halved for causal),
the work at the native dims.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_timing import median_ms, speed_ratio, time_ms, time_rounds  # noqa: E402

TOKENS = 16384
HIDDEN = 2048
SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
QUICK_SEQLENS = (2048, 16384)
HEAD_DIMS = (64, 128)
MLA_DIMS = (192, 128)  # DeepSeek-V3's q/k and v head dims
MLA_HEADS = 16  # 16k tokens of 16 heads, as the d128 rows have (hidden 2048 / 128)


def _tflops(batch, heads, seqlen, head_dim, causal, ms) -> float:
    flops = 4 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
    return flops / ms / 1e9


def _inputs(seqlen, head_dim, dtype=torch.bfloat16):
    batch, heads = TOKENS // seqlen, HIDDEN // head_dim
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=dtype) for _ in range(3))  # (B, S, H, D)
    return batch, heads, q, k, v


def _ours(q, k, v, causal, shape=None):
    from hf_flashpatch.kernels import forward

    if shape is None:
        return lambda: forward.attention_forward(q, k, v, causal=causal, softmax_scale=None, window_left=-1,
                                                 window_right=0 if causal else -1, softcap=None)  # fmt: skip
    return lambda: forward._launch(q, k, v, None, None, 0, 0, None, causal, -1, 0 if causal else -1, 0.0, shape)


def _sdpa(q, k, v, causal, backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, S, D) views
    chosen = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]

    def call():
        with sdpa_kernel(chosen):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

    return call


def _flex(q, k, v, causal):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, S, D) views
    block_mask = None
    if causal:
        seqlen = q.shape[1]
        block_mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, seqlen, seqlen)
    compiled = torch.compile(flex_attention, dynamic=False)
    return lambda: compiled(qt, kt, vt, block_mask=block_mask)


def run(results: list, quick: bool = False) -> None:
    """Append one row per (implementation, head dim, seqlen, causal) to ``results``."""
    seqlens = QUICK_SEQLENS if quick else SEQLENS
    for head_dim in HEAD_DIMS:
        for causal in (False, True):
            for seqlen in seqlens:
                batch, heads, q, k, v = _inputs(seqlen, head_dim)
                peers = {"sdpa_flash": _sdpa(q, k, v, causal, "flash"), "sdpa_cudnn": _sdpa(q, k, v, causal, "cudnn")}
                # Flex recompiles per shape (~20 s each): d128 at 2k (quick) or 2k and 16k (full) only
                if head_dim == 128 and seqlen in ((2048,) if quick else (2048, 16384)):
                    peers["flex"] = _flex(q, k, v, causal)
                ours_variants = {"ours": _ours(q, k, v, causal)}
                reference = peers["sdpa_flash"]().transpose(1, 2).float()  # (B, S, H, D)
                max_diffs = {name: (fn()[0].float() - reference).abs().max().item() for name, fn in ours_variants.items()}
                panel = f"fwd d{head_dim} {'causal' if causal else 'full'}"
                base = dict(part="forward", panel=panel, head_dim=head_dim, seqlen=seqlen, causal=causal, x=seqlen,
                            unit="TFLOP/s")  # fmt: skip
                rounds = time_rounds({**ours_variants, **peers})  # in turns: the same clock state for each
                for name, times in rounds.items():
                    if isinstance(times, Exception):  # a peer backend missing for this shape is reported, not fatal
                        results.append(dict(base, series=name, value=None, error=f"{type(times).__name__}: {times}"[:200]))
                        continue
                    ms = median_ms(times)
                    row = dict(base, series=name, value=_tflops(batch, heads, seqlen, head_dim, causal, ms), ms=ms)
                    if name in max_diffs:
                        row["max_abs_diff_vs_sdpa_flash"] = max_diffs[name]
                    results.append(row)
                timed = {name: times for name, times in rounds.items() if not isinstance(times, Exception)}
                for mine in [name for name in ours_variants if name in timed]:
                    for name, times in timed.items():
                        if not name.startswith("ours"):
                            ratio, low, high = speed_ratio(timed[mine], times)
                            results.append(dict(base, series=f"{mine}/{name}", value=ratio, spread=(low, high),
                                                unit="ratio"))  # fmt: skip
                del q, k, v
                torch.cuda.empty_cache()
    run_value_head_dim(results, quick)


def _mla_inputs(seqlen, dtype=torch.bfloat16):
    """q/k ``(B, S, H, 192)`` and v ``(B, S, H, 128)``, 16k tokens per batch."""
    (head_dim, head_dim_v), batch = MLA_DIMS, TOKENS // seqlen
    q, k = (torch.randn(batch, seqlen, MLA_HEADS, head_dim, device="cuda", dtype=dtype) for _ in range(2))
    v = torch.randn(batch, seqlen, MLA_HEADS, head_dim_v, device="cuda", dtype=dtype)
    return batch, q, k, v


def run_value_head_dim(results: list, quick: bool = False) -> None:
    """The 192/128 rows: ours (the native 192/128 kernel on Hopper, else the padded route) and torch
    SDPA (its own backend choice), same tensors."""
    import hf_flashpatch

    head_dim, head_dim_v = MLA_DIMS
    for causal in (False, True):
        for seqlen in QUICK_SEQLENS if quick else SEQLENS:
            batch, q, k, v = _mla_inputs(seqlen)
            qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, S, D | D_v) views
            impls = {"ours": lambda: hf_flashpatch.flash_attn_func(q, k, v, causal=causal),
                     "sdpa": lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)}  # fmt: skip
            base = dict(part="forward", panel=f"fwd d{head_dim}/{head_dim_v} {'causal' if causal else 'full'}",
                        head_dim=f"{head_dim}/{head_dim_v}", seqlen=seqlen, causal=causal, x=seqlen, unit="TFLOP/s")  # fmt: skip
            fns, outs = {}, {}
            for name, fn in impls.items():
                try:
                    outs[name] = fn()
                    fns[name] = fn
                except Exception as exc:  # a peer that cannot run this shape is reported, not fatal
                    results.append(dict(base, series=name, value=None, error=f"{type(exc).__name__}: {exc}"[:200]))
            timed = {}
            for name, times in time_rounds(fns).items():  # in turns: the same clock state for each
                if isinstance(times, Exception):
                    results.append(dict(base, series=name, value=None, error=f"{type(times).__name__}: {times}"[:200]))
                    continue
                timed[name], ms = times, median_ms(times)
                # the work at the native dims: Q K^T at 192 and P V at 128, i.e. 4 * ... * (192 + 128) / 2
                speed = _tflops(batch, MLA_HEADS, seqlen, (head_dim + head_dim_v) / 2, causal, ms)
                row = dict(base, series=name, value=speed, ms=ms)
                if name == "ours" and "sdpa" in outs:
                    row["max_abs_diff_vs_sdpa"] = (outs["ours"].float() - outs["sdpa"].float()).abs().max().item()
                results.append(row)
            if "ours" in timed and "sdpa" in timed:
                ratio, low, high = speed_ratio(timed["ours"], timed["sdpa"])
                results.append(dict(base, series="ours/sdpa", value=ratio, spread=(low, high), unit="ratio"))
            del q, k, v, qt, kt, vt, impls, outs
            torch.cuda.empty_cache()


def _arch() -> str:
    from hf_flashpatch.kernels.build import device_arch

    return device_arch(torch.device("cuda"))


def _candidate_shapes() -> dict:
    """Alternatives the sweep times against the shipped shape (``ForwardConfig`` validates each): the Hopper
    body with two or three math warpgroups (three at d64 only) and two or three ring stages."""
    from hf_flashpatch.kernels.heuristics import TileShape

    def hopper(block_m, stages):
        return TileShape(block_m=block_m, block_n=128, num_warps=4 * (block_m // 64 + 1), kv_stages=stages,
                         wgmma=True)  # fmt: skip

    two = tuple(hopper(128, s) for s in (2, 3))
    three = tuple(hopper(192, s) for s in (2, 3))
    return {64: two + three, 128: two}


def sweep_tiles(results: list, seqlens=(4096, 16384)) -> None:
    """Time every candidate tile shape (the default among them) at 16k tokens per batch, causal and not."""
    from hf_flashpatch.kernels.heuristics import forward_tile_shape

    for seqlen in seqlens:
        for head_dim, shapes in _candidate_shapes().items():
            batch, heads, q, k, v = _inputs(seqlen, head_dim)
            for causal in (False, True):
                reference = _sdpa(q, k, v, causal, "flash")().transpose(1, 2).float()  # (B, S, H, D)
                cudnn_ms = time_ms(_sdpa(q, k, v, causal, "cudnn"))
                results.append(dict(part="forward", panel="tile sweep", series="sdpa cudnn", head_dim=head_dim,
                                    seqlen=seqlen, causal=causal,
                                    value=_tflops(batch, heads, seqlen, head_dim, causal, cudnn_ms), unit="TFLOP/s"))
                for shape in shapes:
                    fn = _ours(q, k, v, causal, shape)
                    max_diff = (fn()[0].float() - reference).abs().max().item()
                    ms = time_ms(fn)
                    default = shape == forward_tile_shape(head_dim, _arch(), has_mask=causal)
                    results.append(dict(part="forward", panel="tile sweep", series=_shape_name(shape),
                                        head_dim=head_dim, seqlen=seqlen, causal=causal, default=default,
                                        value=_tflops(batch, heads, seqlen, head_dim, causal, ms), unit="TFLOP/s",
                                        max_abs_diff_vs_sdpa_flash=max_diff))  # fmt: skip


def _shape_name(shape) -> str:
    name = f"m{shape.block_m}n{shape.block_n}w{shape.num_warps}s{shape.kv_stages}"
    name += "-wgmma" if shape.wgmma else ""
    return name + ("-qreg" if shape.q_in_registers else "")


def _print(rows: list) -> None:
    print(f"{'series':<28} {'d':>4} {'seqlen':>6} {'causal':>6} {'value':>9} unit")
    for r in rows:
        value = "-" if r.get("value") is None else f"{r['value']:.3g}"
        extra = f"  maxdiff={r['max_abs_diff_vs_sdpa_flash']:.3g}" if "max_abs_diff_vs_sdpa_flash" in r else ""
        extra += f"  maxdiff={r['max_abs_diff_vs_sdpa']:.3g}" if "max_abs_diff_vs_sdpa" in r else ""
        extra += f"  {r['error']}" if "error" in r else ""
        extra += f"  rounds {r['spread'][0]:.3f}-{r['spread'][1]:.3f}" if "spread" in r else ""
        extra += "  (default)" if r.get("default") else ""
        print(f"{r['series'][:28]:<28} {r['head_dim']:>4} {r['seqlen']:>6} {str(r['causal']):>6} {value:>9} "
              f"{r['unit']}{extra}")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="seqlens 2k and 16k only, FlexAttention at d128 2k only")
    parser.add_argument("--sweep", action="store_true", help="also time the candidate tile shapes at seqlens 4k and 16k")
    args = parser.parse_args()
    rows: list = []
    if args.sweep:
        sweep_tiles(rows)
    run(rows, quick=args.quick)
    _print(rows)
