"""Session 32 call 2: d128 on one math warpgroup a CTA, two CTAs a SM (64-row tiles, 64-key tiles, two stages), against
the shipped shapes and cuDNN, in the sustained and the quick timing; the output against the shipped one first."""
import sys
sys.path.insert(0, "scripts")
import torch
import bench_forward as bf
from bench_timing import median_ms, speed_ratio, time_rounds, time_sustained_ms
from hf_flashpatch.kernels.heuristics import TileShape

def one(overlap=True, q_by_tma=False):
    return TileShape(block_m=64, block_n=64, num_warps=8, kv_stages=2, wgmma=True, overlap_softmax=overlap,
                     q_by_tma=q_by_tma, ctas_per_sm=2)
ALT = {"1wg n64 s2": one(), "1wg n64 s2 qtma": one(q_by_tma=True), "1wg n64 s2 ov0": one(overlap=False),
       "n160 s2": TileShape(block_m=128, block_n=160, num_warps=12, kv_stages=2, wgmma=True, overlap_softmax=True)}
ROWS = [(2048, False, ["1wg n64 s2", "1wg n64 s2 qtma", "1wg n64 s2 ov0", "n160 s2"]),
        (4096, False, ["1wg n64 s2", "1wg n64 s2 qtma", "n160 s2"]),
        (16384, False, ["1wg n64 s2", "1wg n64 s2 qtma"]),
        (2048, True, ["1wg n64 s2", "1wg n64 s2 qtma", "1wg n64 s2 ov0"]),
        (16384, True, ["1wg n64 s2", "1wg n64 s2 qtma"])]
for seqlen, causal, alts in ROWS:
    batch, heads, q, k, v = bf._inputs(seqlen, 128)
    fns = {"shipped": bf._ours(q, k, v, causal)}
    ref = fns["shipped"]()[0].float()
    for name in alts:
        fns[name] = bf._ours(q, k, v, causal, ALT[name])
        diff = (fns[name]()[0].float() - ref).abs().max().item()
        print(f"  d128 {seqlen} {'causal' if causal else 'full'} {name}: max |diff| vs shipped {diff:.2e}", flush=True)
    fns["cudnn"] = bf._sdpa(q, k, v, causal, "cudnn")
    for label, timer in (("sustained", lambda fn: time_sustained_ms(fn, 0.5)), ("quick", None)):
        t = time_rounds(fns, 5, timer=timer) if timer else time_rounds(fns, 5)
        for name, times in t.items():
            if isinstance(times, Exception):
                print(f"d128 {seqlen} {name}: {times}")
                continue
            r = speed_ratio(times, t["cudnn"])
            s = speed_ratio(times, t["shipped"])
            print(f"{label:9s} d128 {batch}x{seqlen} {'causal' if causal else 'full':6s} {name:16s} "
                  f"{bf._tflops(batch, heads, seqlen, 128, causal, median_ms(times)):6.1f} TFLOP/s  /cudnn {r[0]:.3f} "
                  f"({r[1]:.3f}-{r[2]:.3f})  /shipped {s[0]:.3f} ({s[1]:.3f}-{s[2]:.3f})", flush=True)
    del q, k, v, fns
    torch.cuda.empty_cache()
