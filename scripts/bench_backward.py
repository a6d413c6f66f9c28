"""Backward attention throughput and training speed: our kernel against torch SDPA (flash, cuDNN) and Flex.

    python scripts/bench_backward.py [--quick] [--max-seqlen] [--sweep]

1. Kernel: FlashAttention's benchmark configuration, 16k tokens per batch (batch = 16384 // seqlen),
   hidden 2048 (heads = 2048 // head_dim), bf16, seqlens 512..16k, head dims 64 and 128, causal and
   not. The backward alone is timed: ours calls ``attention_backward`` on the forward kernel's
   ``out``/``lse``; the peers run ``torch.autograd.grad`` on a retained forward graph. TFLOP/s =
   2.5 * 4 * B * H * S^2 * D / time (halved for causal); the implementations of a shape are timed in turns,
   ``bench_timing.ROUNDS`` rounds, a row the median of its rounds, a ratio the median of the per-round ratios.
   ``ours_det`` is ``deterministic=True`` (separate dQ pass, no atomics).
2. Fine-tuning tokens/s of a Llama-3.2-1B-shaped model (hidden 2048, 32 query / 8 KV heads of 64,
   bf16 weights, random init), one sequence of 4k and 16k tokens, forward + backward, ``hfpatch`` vs ``sdpa``; the
   backends' steps are timed in turns, ``TRAINING_ROUNDS`` rounds, and ``hfpatch/sdpa`` is the median of the
   per-round ratios (its range printed).
   Parts 2 and 3 live in ``bench_training.py``.
3. ``--max-seqlen``: the longest sequence (multiple of 4096 up to 160k, binary search) for which one training step
   of that model with gradient checkpointing fits in GPU memory, ``hfpatch`` vs ``sdpa``.

4. Multi-head latent attention (DeepSeek-V3: q/k head dim 192, v 128; part ``value_head_dim``): the backward
   of the public ``flash_attn_func`` (on Hopper the wgmma body at 192/128; elsewhere v, out and dout zero-padded
   to head dim 192, ``hf_flashpatch/kernels/value_head_dim.py``, the pads timed too) against torch's SDPA on the
   same tensors, its own backend choice. TFLOP/s =
   2.5 * 2 * B * H * S^2 * (192 + 128) / time (halved for causal): the work at the native dims.

5. ``--sweep``: every body this GPU can run (``default``, ``tiled``, and ``wgmma`` on Hopper, each with the
   tiles the heuristics give it, passed to the kernel layer as an explicit config) at seqlen 4k and 16k, d64
   and d128, causal and not, and the tile/unroll overrides of ``SWEEP_CANDIDATES`` at 4k; each row prints
   TFLOP/s and the max |gradient difference| to the default body's gradients.

``run(results, quick)`` appends one dict per measurement for ``scripts/bench.py``.
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
from bench_training import run_max_seqlen, run_training, run_training_packed  # noqa: E402

TOKENS = 16384
HIDDEN = 2048
SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
QUICK_SEQLENS = (2048, 16384)
FLEX_SEQLENS = (2048, 16384)  # the peers' table in the GPU notes has Flex at these
HEAD_DIMS = (64, 128)
BWD_FLOP_FACTOR = 2.5  # backward = 2.5x the forward's 4 * B * H * S^2 * D


def _bwd_tflops(batch, heads, seqlen, head_dim, causal, ms) -> float:
    flops = BWD_FLOP_FACTOR * 4 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
    return flops / ms / 1e9


def _inputs(seqlen, head_dim, dtype=torch.bfloat16):
    batch, heads = TOKENS // seqlen, HIDDEN // head_dim
    q, k, v, dout = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=dtype) for _ in range(4))
    return batch, heads, q, k, v, dout  # each (B, S, H, D)


def _ours(q, k, v, dout, causal, deterministic):
    from hf_flashpatch.kernels import backward, forward

    out, lse = forward.attention_forward(q, k, v, causal=causal, softmax_scale=None, window_left=-1,
                                         window_right=0 if causal else -1, softcap=None)  # fmt: skip
    return lambda: backward.attention_backward(dout, q, k, v, out, lse, causal=causal, deterministic=deterministic)


def _ours_config(q, k, v, dout, causal, cfg):
    """The non-deterministic backward with an explicit ``BackwardConfig`` (not the one the heuristics pick)."""
    import math

    from hf_flashpatch.kernels import backward, forward

    out, lse = forward.attention_forward(q, k, v, causal=causal, softmax_scale=None, window_left=-1,
                                         window_right=0 if causal else -1, softcap=None)  # fmt: skip
    scale, right = 1.0 / math.sqrt(q.shape[-1]), 0 if causal else -1
    return lambda: backward._kernel_backward(cfg, dout, q, k, v, out, lse, None, None, None, 0, 0, scale, -1, right,
                                             0.0, False)  # fmt: skip


def _bodies(head_dim: int) -> dict:
    """``{body: config}`` of every body this GPU runs at ``head_dim``: the default body (the deterministic
    path's tiles), the tiled body (other GPUs' choice) and, on Hopper, the wgmma body."""
    import dataclasses

    from hf_flashpatch.kernels import backward
    from hf_flashpatch.kernels.build import device_arch

    arch = device_arch(torch.device("cuda"))
    configs = [backward.BackwardConfig.choose(head_dim, torch.bfloat16, False, arch, deterministic=True),
               dataclasses.replace(backward.BackwardConfig.choose(head_dim, torch.bfloat16, False, "sm_80"), arch=arch)]
    if arch == "sm_90a":
        configs.append(backward.BackwardConfig.choose(head_dim, torch.bfloat16, False, arch))
    return {cfg.body: cfg for cfg in configs}


def _other_bodies(head_dim: int) -> dict:
    """Bodies timed next to the one the heuristics pick."""
    from hf_flashpatch.kernels import backward
    from hf_flashpatch.kernels.build import device_arch

    in_force = backward.BackwardConfig.choose(head_dim, torch.bfloat16, False, device_arch(torch.device("cuda")))
    return {name: cfg for name, cfg in _bodies(head_dim).items() if cfg != in_force}


def _retained_backward(forward_fn, q, k, v, dout):
    """Backward alone of a peer: autograd.grad on a forward graph kept alive across calls."""
    qt, kt, vt = (t.transpose(1, 2).detach().requires_grad_() for t in (q, k, v))  # (B, H, S, D) views
    out = forward_fn(qt, kt, vt)
    dout_t = dout.transpose(1, 2)
    return lambda: torch.autograd.grad(out, (qt, kt, vt), dout_t, retain_graph=True)


def _sdpa(q, k, v, dout, causal, backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
    with sdpa_kernel(chosen):
        grad = _retained_backward(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=causal), q, k, v, dout)

    def call():
        with sdpa_kernel(chosen):
            return grad()

    return call


def _flex(q, k, v, dout, causal):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    block_mask = None
    if causal:
        seqlen = q.shape[1]
        block_mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, seqlen, seqlen)
    compiled = torch.compile(flex_attention, dynamic=False)
    return _retained_backward(lambda a, b, c: compiled(a, b, c, block_mask=block_mask), q, k, v, dout)


def _time_panel(results: list, impls: dict, base: dict, flops: tuple) -> None:
    """Time each implementation of one shape (``flops`` = batch, heads, seqlen, head_dim, causal), record its
    TFLOP/s, its max |gradient difference| to SDPA flash's and each of ours' ratio to each peer."""
    panel, seqlen = base["panel"], base["seqlen"]
    fns, grads = {}, {}
    for name, make in impls.items():
        try:
            fn = make()
            got = fn()
            grads[name] = got if name.startswith("ours") else [g.transpose(1, 2) for g in got]  # (B, S, H, D)
            fns[name] = fn
        except Exception as exc:  # a peer missing for this shape is reported, not fatal
            results.append(dict(base, series=name, value=None, error=f"{type(exc).__name__}: {exc}"[:200]))
    timed = {}
    for name, times in time_rounds(fns).items():  # in turns: the same clock state for each
        if isinstance(times, Exception):
            results.append(dict(base, series=name, value=None, error=f"{type(times).__name__}: {times}"[:200]))
            continue
        timed[name] = times
        ms = median_ms(times)
        results.append(dict(base, series=name, value=_bwd_tflops(*flops, ms), ms=ms))
    mine = [name for name in grads if name.startswith("ours") and name != "ours_det"]
    for name in mine if "sdpa_flash" in grads else []:
        # peers on repeated K/V (GQA shapes) return per-query-head dK/dV: sum them back over each group
        theirs = [g if g.shape == o.shape else g.unflatten(2, (o.shape[2], -1)).sum(3)
                  for g, o in zip(grads["sdpa_flash"], grads[name])]  # fmt: skip
        diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(grads[name], theirs))
        next(r for r in results if r is not None and r.get("series") == name and r.get("panel") == panel
             and r.get("seqlen") == seqlen)["max_abs_grad_diff_vs_sdpa_flash"] = diff  # fmt: skip
    for name in [m for m in mine if m in timed]:
        for peer, times in timed.items():
            if not peer.startswith("ours"):
                ratio, low, high = speed_ratio(timed[name], times)
                results.append(dict(base, series=f"{name}/{peer}", value=ratio, spread=(low, high), unit="ratio"))


def run_kernels(results: list, quick: bool = False, head_dims: tuple = HEAD_DIMS) -> None:
    seqlens = QUICK_SEQLENS if quick else SEQLENS
    for head_dim in head_dims:
        for causal in (False, True):
            for seqlen in seqlens:
                batch, heads, q, k, v, dout = _inputs(seqlen, head_dim)
                impls = {"ours": lambda: _ours(q, k, v, dout, causal, False),
                         "ours_det": lambda: _ours(q, k, v, dout, causal, True),
                         "sdpa_flash": lambda: _sdpa(q, k, v, dout, causal, "flash"),
                         "sdpa_cudnn": lambda: _sdpa(q, k, v, dout, causal, "cudnn")}  # fmt: skip
                for name, cfg in _other_bodies(head_dim).items():
                    impls[f"ours:{name}"] = lambda cfg=cfg: _ours_config(q, k, v, dout, causal, cfg)
                if not quick and head_dim == 128 and seqlen in FLEX_SEQLENS:  # Flex compiles per shape (~20 s)
                    impls["flex"] = lambda: _flex(q, k, v, dout, causal)
                base = dict(part="backward", panel=f"bwd d{head_dim} {'causal' if causal else 'full'}",
                            head_dim=head_dim, seqlen=seqlen, causal=causal, x=seqlen, unit="TFLOP/s")  # fmt: skip
                _time_panel(results, impls, base, (batch, heads, seqlen, head_dim, causal))
                del q, k, v, dout, impls
                torch.cuda.empty_cache()


def _retained_ours(forward_fn, q, k, v, dout):
    """Backward alone of a public API call: autograd.grad on its forward graph, kept alive across calls. q/k/v
    ``(B, S, H, D)``, as the API takes them (the peers' ``_retained_backward`` hands them ``(B, H, S, D)`` views)."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = forward_fn(*leaves)
    return lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)


def run_value_head_dim(results: list, quick: bool = False) -> None:
    """The 192/128 backward rows: ours (the route ``flash_attn_func`` takes on this GPU) and torch SDPA (its own
    backend choice)."""
    import hf_flashpatch
    from bench_forward import MLA_DIMS, _mla_inputs

    head_dim, head_dim_v = MLA_DIMS
    for causal in (False, True):
        for seqlen in QUICK_SEQLENS if quick else SEQLENS:
            batch, q, k, v = _mla_inputs(seqlen)
            dout = torch.randn(*q.shape[:3], head_dim_v, device="cuda", dtype=q.dtype)  # (B, S, H, D_v)
            ours = lambda a, b, c: hf_flashpatch.flash_attn_func(a, b, c, causal=causal)  # noqa: E731
            sdpa = lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=causal)  # noqa: E731
            impls = {"ours": lambda: _retained_ours(ours, q, k, v, dout),
                     "sdpa": lambda: _retained_backward(sdpa, q, k, v, dout)}  # fmt: skip
            base = dict(part="backward", panel=f"bwd d{head_dim}/{head_dim_v} {'causal' if causal else 'full'}",
                        head_dim=f"{head_dim}/{head_dim_v}", seqlen=seqlen, causal=causal, x=seqlen, unit="TFLOP/s")  # fmt: skip
            # the work at the native dims: 4 * B * H * S^2 * (192 + 128) / 2 per forward, 2.5x that backward
            _time_panel(results, impls, base, (batch, q.shape[2], seqlen, (head_dim + head_dim_v) / 2, causal))
            del q, k, v, dout, impls
            torch.cuda.empty_cache()


FINETUNE_HEADS = (32, 8)  # Llama-3.2-1B: 32 query heads, 8 KV heads of 64
FINETUNE_SEQLENS = (2048, 4096, 8192, 16384)


def run_finetune_shapes(results: list, quick: bool = False) -> None:
    """The fine-tune rows' attention alone: one causal sequence, 32 query / 8 KV heads of 64 (GQA read natively
    by ours; the peers get K/V repeated to 32 heads, as transformers' ``repeat_kv`` gives them). Few CTAs per
    SM here (seqlen / 128 x 8 at 4k: 256), unlike the 16k-token batches of ``run_kernels``."""
    heads, kv_heads = FINETUNE_HEADS
    for seqlen in FINETUNE_SEQLENS[1::2] if quick else FINETUNE_SEQLENS:
        q, dout = (torch.randn(1, seqlen, heads, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        k, v = (torch.randn(1, seqlen, kv_heads, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        k_rep, v_rep = (t.repeat_interleave(heads // kv_heads, dim=2) for t in (k, v))  # (1, S, 32, 64)
        impls = {"ours": lambda: _ours(q, k, v, dout, True, False),
                 "sdpa_flash": lambda: _sdpa(q, k_rep, v_rep, dout, True, "flash"),
                 "sdpa_cudnn": lambda: _sdpa(q, k_rep, v_rep, dout, True, "cudnn")}  # fmt: skip
        for name, cfg in _other_bodies(64).items():
            impls[f"ours:{name}"] = lambda cfg=cfg: _ours_config(q, k, v, dout, True, cfg)
        base = dict(part="backward", panel=f"bwd d64 causal, 1 x seqlen, {heads}/{kv_heads} heads (fine-tune shape)",
                    head_dim=64, seqlen=seqlen, causal=True, x=seqlen, unit="TFLOP/s")  # fmt: skip
        _time_panel(results, impls, base, (1, heads, seqlen, 64, True))
        del q, k, v, dout, k_rep, v_rep, impls
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------ tile sweep

# Spill-free alternatives to BackwardConfig.choose's pick (checked with ptxas -v), as field overrides.
SWEEP_CANDIDATES = {
    128: [{}, {"dq_warp_rows": 32}, {"ss_unroll": 4}, {"ss_unroll": 4, "dq_warp_rows": 32}, {"ss_unroll": 1},
          {"block_m": 32, "ss_unroll": 8}, {"block_m": 32, "ss_unroll": 8, "dq_chunk": 16}],
    64: [{}, {"dq_warp_rows": 32}, {"ss_unroll": 8}, {"ss_unroll": 1}, {"block_m": 32}, {"block_m": 32, "ss_unroll": 8}],
}  # fmt: skip


SWEEP_BODY_SEQLENS = (4096, 16384)  # the bodies (_bodies) are timed at both


def sweep_configs(results: list, seqlen: int = 4096) -> None:
    """Time each body (``_bodies``, at every seqlen of ``SWEEP_BODY_SEQLENS``) and each
    override candidate of ``SWEEP_CANDIDATES`` (at ``seqlen``) of the non-deterministic backward; the
    gradients' max difference to the default config's is recorded as a correctness smoke check."""
    import dataclasses
    import math

    from hf_flashpatch.kernels import backward, forward

    plan = [(n, head_dim) for n in SWEEP_BODY_SEQLENS for head_dim in SWEEP_CANDIDATES]
    for seqlen_now, head_dim in plan:
        batch, heads, q, k, v, dout = _inputs(seqlen_now, head_dim)
        bodies = _bodies(head_dim)
        default = bodies["default"]
        named = [(f"body={name}", cfg) for name, cfg in bodies.items()]  # body=default first
        overrides_list = SWEEP_CANDIDATES[head_dim][1:] if seqlen_now == seqlen else []
        candidates = named + [(repr(o), dataclasses.replace(default, **o)) for o in overrides_list]
        for causal in (False, True):
            right = 0 if causal else -1
            out, lse = forward.attention_forward(q, k, v, causal=causal, softmax_scale=None, window_left=-1,
                                                 window_right=right, softcap=None)  # fmt: skip
            scale = 1.0 / math.sqrt(head_dim)
            reference = None  # the first candidate is body=default
            for label, cfg in candidates:

                def call(cfg=cfg):
                    return backward._kernel_backward(cfg, dout, q, k, v, out, lse, None, None, None, 0, 0, scale, -1,
                                                     right, 0.0, False)  # fmt: skip

                grads = call()
                if reference is None:
                    reference = grads
                diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(grads, reference))
                ms = time_ms(call)
                results.append(dict(part="backward", panel="bwd tile sweep", series=label,
                                    head_dim=head_dim, seqlen=seqlen_now, causal=causal, x=seqlen_now, unit="TFLOP/s",
                                    value=_bwd_tflops(batch, heads, seqlen_now, head_dim, causal, ms), ms=ms,
                                    max_abs_diff_vs_default=diff))  # fmt: skip
        del q, k, v, dout
        torch.cuda.empty_cache()


PARTS = ("kernels", "finetune_shapes", "value_head_dim", "training", "packed")


def run(results: list, quick: bool = False, max_seqlen: bool = False, sweep: bool = False, only: tuple = PARTS,
        head_dims: tuple = HEAD_DIMS) -> None:  # fmt: skip
    """Append the kernel (at ``head_dims``), training-speed and packed-training rows named in ``only``, then
    (with ``sweep``) tile-sweep and (with ``max_seqlen``) memory-limit rows to ``results``. A part that fails
    is reported as an error row and the next part still runs."""
    named = {"kernels": lambda r: run_kernels(r, quick, head_dims), "finetune_shapes": lambda r: run_finetune_shapes(r, quick),
             "value_head_dim": lambda r: run_value_head_dim(r, quick), "training": lambda r: run_training(r, quick),
             "packed": lambda r: run_training_packed(r, quick)}  # fmt: skip
    unknown = set(only) - set(named)
    if unknown:
        raise ValueError(f"unknown parts {sorted(unknown)}; choose from {list(PARTS)}")
    parts = [named[name] for name in PARTS if name in only]
    parts += [sweep_configs] if sweep else []
    parts += [run_max_seqlen] if max_seqlen else []
    for part in parts:
        try:
            part(results)
        except Exception as exc:
            results.append(dict(part="backward", panel="failed part", series="error", head_dim=0, seqlen=0,
                                causal=False, value=None, unit="", error=f"{type(exc).__name__}: {exc}"[:300]))  # fmt: skip


def _print(rows: list) -> None:
    print(f"{'series':<22} {'d':>4} {'seqlen':>6} {'causal':>6} {'value':>10} unit")
    for r in rows:
        value = "-" if r.get("value") is None else f"{r['value']:.4g}"
        extra = f"  {r['error']}" if "error" in r else ""
        extra += f"  rounds {r['spread'][0]:.3f}-{r['spread'][1]:.3f}" if "spread" in r else ""
        extra += f"  maxdiff={r['max_abs_grad_diff_vs_sdpa_flash']:.3g}" if "max_abs_grad_diff_vs_sdpa_flash" in r else ""
        extra += f"  diff_vs_default={r['max_abs_diff_vs_default']:.3g}" if "max_abs_diff_vs_default" in r else ""
        extra += f"  [{r['panel']}]" if r["unit"] in ("tokens/s", "tokens", "") or "llama" in r.get("panel", "") else ""
        # rows such as the packed batch's loss carry no head dim / seqlen / causal
        print(f"{r['series'][:22]:<22} {r.get('head_dim', '-'):>4} {r.get('seqlen', '-'):>6} "
              f"{str(r.get('causal', '-')):>6} {value:>10} {r['unit']}{extra}")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="seqlens 2k and 16k, no Flex (compile time), 4-layer model")
    parser.add_argument("--max-seqlen", action="store_true", help="also binary-search the longest trainable sequence")
    parser.add_argument("--max-seqlen-only", action="store_true", help="only that search (no kernel or training rows)")
    parser.add_argument("--sweep", action="store_true", help="also time every body (4k, 16k) and the SWEEP_CANDIDATES configs (4k)")
    parser.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts of {PARTS} (default all)")
    parser.add_argument("--head-dims", default=",".join(map(str, HEAD_DIMS)), help="kernel rows' head dims")
    args = parser.parse_args()
    rows: list = []
    if args.max_seqlen_only:
        run_max_seqlen(rows)
    else:
        run(rows, quick=args.quick, max_seqlen=args.max_seqlen, sweep=args.sweep, only=tuple(args.only.split(",")),
            head_dims=tuple(int(d) for d in args.head_dims.split(",")))  # fmt: skip
    _print(rows)
