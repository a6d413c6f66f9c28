"""A/B of two source trees of the project on the GPU: same calls, same inputs, interleaved processes.

    python scripts/ab_kernels.py --tree base=/path/to/old/checkout --tree head=. [--rounds 3] [--only REGEX]
    python scripts/ab_kernels.py --tree old=git:1d2025f --tree draft=git:wip/some-branch --tree head=.

A tree is a path, or ``git:REV``: the revision's ``cuda/``, ``hf_flashpatch/`` and ``scripts/`` exported from
this checkout's repository into the run's scratch folder.

Checks that a refactor of the kernel layer changed neither results nor speed. Each round starts one
worker process per tree (``sys.path`` puts that tree first, its own kernel cache), in rotating
order; every worker times the same cases and saves its outputs. After every round (so a run cut short
keeps the rounds it finished) a table prints the median time per case and tree, the ratio to the first
tree, and the largest difference of the outputs from the first tree's (0 where the kernels are the same:
the forward and decode are deterministic; the backward accumulates dQ with atomics, so it differs in
the last bits from call to call).

Cases (bf16, layout (batch, seqlen, heads, head_dim), random inputs seeded by the case's name; a worker builds
only the cases ``--only`` selects):
- forward and backward (kernel time in a CUDA graph, and per eager call), 4 x 4096, 16 heads,
  d128, causal and not; d64 (forward: causal and not; backward: causal); the forward at 8 x 2048 (d128 and d64, causal
  and not) and 2 x 8192 (d128, causal and not), both at 1 x 16384 (d128, causal and not), the forward at d96 and
  d256 (the mma.sync body), causal, and
  at q/k 192, v 128 (forward: causal and not; backward: causal);
- decode over a contiguous cache and over a shuffled paged pool (page 16), GQA 32/8, d128: kernel
  time in a CUDA graph (host checks skipped under capture), and per eager call with the default
  host-side table checks and without them (``check_inputs=False``; the older API has no check): the
  overhead users see without graphs.
Eager times are CUDA-event medians of ``--repeats`` calls after a warm-up call; graph times are the
mean call in ``--repeats`` replays of a 10-call graph (``bench_decode``'s timer).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BF16 = "bfloat16"


DEVICE = "cuda"  # the tests build cases on the CPU


def _case_builders(torch, hfp):
    """name -> (build, form): ``build(rand)`` makes a case's inputs with ``rand(*shape)`` (bf16 normals) and returns
    the callable to time; ``form`` says how it is timed ("graph": CUDA graph and eager, "eager")."""
    builders = {}

    def case(name, form="graph"):
        def register(build):
            builders[name] = (build, form)
            return build

        return register

    def attention(shape_q, shape_kv, d_v=None, causal=False):  # a forward case: q (B, S, H, D), k/v (B, S, H_kv, D)
        def build(rand):
            q, k = rand(*shape_q), rand(*shape_kv)
            v = rand(*shape_kv[:-1], d_v or shape_kv[-1])
            return lambda: hfp.flash_attn_func(q, k, v, causal=causal)

        return build

    for d, causal in [(128, False), (128, True), (64, False), (64, True)]:
        case(f"fwd d{d} 4x4k {'causal' if causal else 'full'}")(
            attention((4, 4096, 16, d), (4, 4096, 16, d), causal=causal))
    for causal in (False, True):  # short sequences: a CTA's prologue and epilogue weigh most here
        case(f"fwd d128 8x2k {'causal' if causal else 'full'}")(
            attention((8, 2048, 16, 128), (8, 2048, 16, 128), causal=causal))
    for causal in (False, True):  # between the 2k-4k and 16k rows
        case(f"fwd d128 2x8k {'causal' if causal else 'full'}")(
            attention((2, 8192, 16, 128), (2, 8192, 16, 128), causal=causal))
    for causal in (False, True):  # bench_forward's d128 16k rows: one sequence of 16 heads
        case(f"fwd d128 1x16k {'causal' if causal else 'full'}")(
            attention((1, 16384, 16, 128), (1, 16384, 16, 128), causal=causal))
    for causal in (False, True):  # 256 pairs of short sequences
        case(f"fwd d64 8x2k {'causal' if causal else 'full'}")(
            attention((8, 2048, 32, 64), (8, 2048, 32, 64), causal=causal))
    for causal in (False, True):  # bench_forward's d64 16k rows: one sequence of 32 heads
        case(f"fwd d64 1x16k {'causal' if causal else 'full'}")(
            attention((1, 16384, 32, 64), (1, 16384, 32, 64), causal=causal))
    for batch, seqlen in ((4, 4096), (1, 16384)):  # the fine-tune model's attention: 32 query / 8 KV heads, d64
        case(f"fwd d64 {batch}x{seqlen // 1024}k causal gqa4")(
            attention((batch, seqlen, 32, 64), (batch, seqlen, 8, 64), causal=True))
    for d in (96, 256):  # head dims the mma.sync body serves on every GPU
        case(f"fwd d{d} 4x4k causal")(attention((4, 4096, 16, d), (4, 4096, 16, d), causal=True))
    for causal in (False, True):  # multi-head latent attention's q/k 192, v 128
        case(f"fwd d192/128 4x4k {'causal' if causal else 'full'}")(
            attention((4, 4096, 16, 192), (4, 4096, 16, 192), d_v=128, causal=causal))

    # the backward kernel alone (the op autograd calls) on the forward kernel's out / lse, so that a CUDA graph
    # captures it (autograd would run it on the stream of the forward, outside the capture)
    def backward(shape, d_v=None, kv_heads=None, causal=False):
        def build(rand):
            from hf_flashpatch.kernels import backward as bwd_kernels, forward as fwd_kernels

            q = rand(*shape)
            kv_shape = (*shape[:2], kv_heads or shape[2], shape[3])
            k, v = rand(*kv_shape), rand(*kv_shape[:-1], d_v or shape[3])
            out, lse = fwd_kernels.attention_forward(q, k, v, causal=causal, softmax_scale=None, window_left=-1,
                                                     window_right=0 if causal else -1, softcap=None)  # fmt: skip
            grad = rand(*out.shape)
            return lambda: bwd_kernels.attention_backward(grad, q, k, v, out, lse, causal=causal)

        return build

    for d, causal in [(128, False), (128, True), (64, True)]:
        case(f"bwd d{d} 4x4k {'causal' if causal else 'full'}")(backward((4, 4096, 16, d), causal=causal))
    for d, heads in [(128, 16), (64, 32)]:  # bench_backward's 2k rows: 8 sequences, short blocks (one wave = 132)
        case(f"bwd d{d} 8x2k full")(backward((8, 2048, heads, d)))
    for causal in (False, True):  # bench_backward's d128 16k rows: one sequence of 16 heads
        case(f"bwd d128 1x16k {'causal' if causal else 'full'}")(backward((1, 16384, 16, 128), causal=causal))
    case("bwd d192/128 4x4k causal")(backward((4, 4096, 16, 192), d_v=128, causal=True))  # multi-head latent attention
    for length in (4096, 16384):  # the fine-tune shape: one sequence, 32 / 8 heads (few blocks: 8 x length / 128)
        case(f"bwd d64 1x{length // 1024}k 32/8 causal")(backward((1, length, 32, 64), kv_heads=8, causal=True))

    # the table check of the newer API: off in the "unchecked" rows (the older API has no check)
    has_check = "check_inputs" in inspect.signature(hfp.flash_attn_with_kvcache).parameters
    unchecked = {"check_inputs": False} if has_check else {}

    def contiguous_decode(batch, length, valid, checks):  # q (B, 1, 32, 128) over a (B, length, 8, 128) cache
        def build(rand):
            q, k_cache, v_cache = rand(batch, 1, 32, 128), rand(batch, length, 8, 128), rand(batch, length, 8, 128)
            lens = torch.full((batch,), valid, dtype=torch.int32, device=DEVICE)
            return lambda: hfp.flash_attn_with_kvcache(q, k_cache, v_cache, lens, **checks)

        return build

    def paged_decode(checks, batch=64, length=4096, page=16):  # the same cache as a shuffled pool of 16-token pages
        def build(rand):
            q, k_cache, v_cache = rand(batch, 1, 32, 128), rand(batch, length, 8, 128), rand(batch, length, 8, 128)
            lens = torch.full((batch,), length, dtype=torch.int32, device=DEVICE)
            pages_per_row = length // page
            order = torch.randperm(batch * pages_per_row, device=DEVICE).int()
            table = order.view(batch, pages_per_row)  # (B, pages): row b's pages, shuffled in the pool
            k_pages = torch.empty(batch * pages_per_row, page, 8, 128, device=DEVICE, dtype=k_cache.dtype)
            v_pages = torch.empty_like(k_pages)
            k_pages[order.long()] = k_cache.reshape(batch * pages_per_row, page, 8, 128)  # (B*pages, page, H_kv, D)
            v_pages[order.long()] = v_cache.reshape(batch * pages_per_row, page, 8, 128)
            return lambda: hfp.flash_attn_paged_decode(q, k_pages, v_pages, table, lens, **checks)

        return build

    case("decode 64x4k contiguous")(contiguous_decode(64, 4096, 4096, {}))
    case("decode 64x4k contiguous unchecked", "eager")(contiguous_decode(64, 4096, 4096, unchecked))
    case("decode 64x4k paged16")(paged_decode({}))
    case("decode 64x4k paged16 unchecked", "eager")(paged_decode(unchecked))
    case("decode 8x1k contiguous")(contiguous_decode(8, 1024, 1000, {}))
    case("decode 8x1k contiguous unchecked", "eager")(contiguous_decode(8, 1024, 1000, unchecked))
    return builders


def _cases(torch, hfp, only: str = ""):
    """name -> (callable, form) for the cases whose name matches ``only``, inputs built here, before any timing, and
    only for those: a case's inputs come from a generator seeded by its name, so they are the same whatever else is
    selected (and in every tree)."""
    import zlib

    cases = {}
    for name, (build, form) in _case_builders(torch, hfp).items():
        if not re.search(only, name):
            continue
        torch.manual_seed(zlib.crc32(name.encode()))  # the paged pool's shuffle
        gen = torch.Generator(device=DEVICE).manual_seed(zlib.crc32(name.encode()))
        try:
            cases[name] = (build(lambda *shape, gen=gen: torch.randn(*shape, device=DEVICE, dtype=torch.bfloat16,
                                                                        generator=gen)), form)  # fmt: skip
        except Exception as exc:  # a tree that cannot build the case (its forward refuses it): a "-" in the table
            print(f"{name}: not built ({type(exc).__name__}: {exc})", file=sys.stderr)
    return cases


def _time_ms(torch, fn, repeats):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def worker(tree: str, out: str, repeats: int, only: str) -> None:
    sys.path.insert(0, str(Path(tree).resolve()))
    import torch

    import hf_flashpatch as hfp
    from bench_decode import _graph_time_us as graph_time_us  # this script's folder is on sys.path

    assert Path(hfp.__file__).resolve().is_relative_to(Path(tree).resolve()), hfp.__file__
    times, outputs = {}, {}
    for name, (fn, form) in _cases(torch, hfp, only).items():
        try:
            result = fn()
        except Exception as exc:  # an older tree that does not serve the case: a "-" in the table
            print(f"{tree}: {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        outputs[name] = [t.detach().cpu() for t in (result if isinstance(result, tuple) else (result,))]
        if form == "eager":
            times[f"{name} (eager)"] = _time_ms(torch, fn, repeats)
        elif form == "graph":
            try:
                times[f"{name} (graph)"] = graph_time_us(fn, repeats) / 1000.0
            except Exception as exc:  # a tree whose call cannot be captured: its eager time only
                print(f"{tree}: {name}: no CUDA graph ({type(exc).__name__}: {exc})", file=sys.stderr)
                torch.cuda.synchronize()
            times[f"{name} (eager)"] = _time_ms(torch, fn, repeats)
        else:
            times[name] = _time_ms(torch, fn, repeats)
    torch.save(outputs, out + ".pt")
    Path(out).write_text(json.dumps(times))


def export_tree(spec: str, into: Path) -> str:
    """A tree's path: ``spec`` itself, or for ``git:REV`` the revision's kernel layer exported into ``into``."""
    if not spec.startswith("git:"):
        return spec
    into.mkdir(parents=True)
    repo = Path(__file__).resolve().parent.parent
    archive = subprocess.run(["git", "-C", str(repo), "archive", spec[4:], "cuda", "hf_flashpatch", "scripts"],
                             check=True, capture_output=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return str(into)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", action="append", default=[], help="NAME=PATH, the first is the base")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--only", default="", metavar="REGEX", help="only the cases whose name matches")
    parser.add_argument("--worker", nargs=2, metavar=("TREE", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(*args.worker, args.repeats, args.only)
    scratch = Path(tempfile.mkdtemp(prefix="ab_kernels_"))
    trees = [(name, export_tree(spec, scratch / f"tree_{name}")) for name, spec in (t.split("=", 1) for t in args.tree)]
    runs = {name: [] for name, _ in trees}
    for round_ in range(args.rounds):
        # each round starts one tree later, so over len(trees) rounds every tree takes every position once
        # (the GPU warms over a round: a fixed order favours the first tree)
        order = trees[round_ % len(trees):] + trees[:round_ % len(trees)]
        for name, path in order:
            out = str(scratch / f"{name}_{round_}.json")
            env = dict(os.environ, HF_FLASHPATCH_CACHE=str(scratch / f"cache_{name}"))
            env["PYTHONPATH"] = os.pathsep.join([str(Path(path).resolve()), env.get("PYTHONPATH", "")])
            subprocess.run([sys.executable, __file__, "--worker", path, out, "--repeats", str(args.repeats),
                            "--only", args.only],
                           check=True, env=env)  # fmt: skip
            runs[name].append(json.loads(Path(out).read_text()))
        # a table after every complete round: a run cut short by a time limit still leaves its medians
        _print_table(trees, runs, scratch, f"after round {round_ + 1} of {args.rounds}")


def _print_table(trees, runs, scratch, title: str) -> None:
    """Median time per case and tree, the ratio to the first tree, and the largest output difference."""
    import torch

    base = trees[0][0]
    base_out = torch.load(scratch / f"{base}_0.json.pt")
    diff = {name: {case: max((a.float() - b.float()).abs().max().item() for a, b in zip(base_out[case], outs[case]))
                   for case in base_out if case in outs}
            for name in runs for outs in [torch.load(scratch / f"{name}_0.json.pt")]}  # fmt: skip
    names = [n for n, _ in trees]
    print(f"\n{title}\n{'case':42s}" + "".join(f"{n + ' ms':>12s}" for n in names) + "".join(
        f"{n + '/' + base:>14s}" for n in names[1:]) + "  max |diff| vs " + base)
    for case in sorted({case for n in names for r in runs[n] for case in r}, key=_case_order(runs[base])):
        med = {n: statistics.median(r[case] for r in runs[n]) if all(case in r for r in runs[n]) else None
               for n in names}  # fmt: skip
        cells = "".join(f"{med[n]:>12.4f}" if med[n] is not None else f"{'-':>12s}" for n in names)
        ratios = "".join(f"{med[n] / med[base]:>14.3f}" if None not in (med[n], med[base]) else f"{'-':>14s}"
                         for n in names[1:])  # fmt: skip
        worst = [diff[n].get(case.split(" (")[0]) for n in names[1:]]
        worst = [w for w in worst if w is not None]
        print(f"{case:42s}" + cells + ratios + (f"  {max(worst):.3g}" if worst else "  -"), flush=True)


def _case_order(base_rounds):
    """Sort key: the base tree's case order first, then cases only other trees ran."""
    order = {case: i for i, case in enumerate(base_rounds[0])} if base_rounds else {}
    return lambda case: (order.get(case, len(order)), case)


if __name__ == "__main__":
    main()
