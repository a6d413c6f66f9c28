"""Session 32 call 6: the chained walk without its in-loop store (a timing probe: wrong outputs), beside the chained walk, (one key loop over all works, copy_q_ahead + chain_works) at d128, against the
shipped shapes and cuDNN, in the sustained and the quick timing; correctness against the shipped output first."""
import sys
sys.path.insert(0, "scripts")
import torch
import bench_forward as bf
from bench_timing import median_ms, speed_ratio, time_rounds, time_sustained_ms
from hf_flashpatch.kernels.heuristics import TileShape

def shape(n, stages, ahead, chain=0):
    return TileShape(block_m=128, block_n=n, num_warps=12, kv_stages=stages, wgmma=True, overlap_softmax=True,
                     copy_q_ahead=ahead, chain_works=chain)
ALT = {"n160 s2": shape(160, 2, False), "n160 chain": shape(160, 2, True, 1), "n160 chain nostore": shape(160, 2, True, 2), "n160 chain rescale-under-S nostores": shape(160, 2, True, 3),
       "n128 s2": shape(128, 2, False)}
ROWS = [(2048, False, ["n160 s2", "n160 chain nostore", "n160 chain rescale-under-S nostores"]),
        (16384, False, ["n160 s2", "n160 chain nostore", "n160 chain rescale-under-S nostores"])]
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
            print(f"{label:9s} d128 {batch}x{seqlen} {'causal' if causal else 'full':6s} {name:14s} "
                  f"{bf._tflops(batch, heads, seqlen, 128, causal, median_ms(times)):6.1f} TFLOP/s  /cudnn {r[0]:.3f} "
                  f"({r[1]:.3f}-{r[2]:.3f})  /shipped {s[0]:.3f} ({s[1]:.3f}-{s[2]:.3f})", flush=True)
    del q, k, v, fns
    torch.cuda.empty_cache()
