"""Tile shapes at 2k (and 4k) in the sustained timing: the shipped Hopper shapes against alternatives, cuDNN beside."""
import sys
sys.path.insert(0, "scripts")
import torch
import bench_forward as bf
from bench_timing import median_ms, speed_ratio, time_rounds, time_sustained_ms
from hf_flashpatch.kernels.heuristics import TileShape, forward_tile_shape

ALT = {
    "m128 n176 s2 ov1 qtma": TileShape(block_m=128, block_n=176, num_warps=12, kv_stages=2, wgmma=True,
                                       overlap_softmax=True, q_by_tma=True),
    "m128 n176 s2 ov1 staged": TileShape(block_m=128, block_n=176, num_warps=12, kv_stages=2, wgmma=True,
                                         overlap_softmax=True, staged_output=True),
    "m128 n128 s3 ov1": TileShape(block_m=128, block_n=128, num_warps=12, kv_stages=3, wgmma=True, overlap_softmax=True),
    "m128 n176 s3 ov1": TileShape(block_m=128, block_n=176, num_warps=12, kv_stages=3, wgmma=True, overlap_softmax=True),
    "m128 n128 s3 qtma own": TileShape(block_m=128, block_n=128, num_warps=12, kv_stages=3, wgmma=True, q_by_tma=True,
                                       own_key_tiles=True),
    "m128 n128 s3 ov1 qtma": TileShape(block_m=128, block_n=128, num_warps=12, kv_stages=3, wgmma=True,
                                       overlap_softmax=True, q_by_tma=True),
}
ROWS = [(128, 2048, False, ["m128 n176 s2 ov1 qtma", "m128 n176 s2 ov1 staged"]),
        (128, 16384, False, ["m128 n176 s2 ov1 qtma", "m128 n176 s2 ov1 staged"])]
timer = lambda fn: time_sustained_ms(fn, 0.5)
for d, seqlen, causal, alts in ROWS:
    batch, heads, q, k, v = bf._inputs(seqlen, d)
    fns = {"shipped": bf._ours(q, k, v, causal)}
    ref = fns["shipped"]()[0].float()
    for name in alts:
        fns[name] = bf._ours(q, k, v, causal, ALT[name])
        diff = (fns[name]()[0].float() - ref).abs().max().item()
        print(f"  d{d} {seqlen} {'causal' if causal else 'full'} {name}: max |diff| vs shipped {diff:.2e}", flush=True)
    fns["cudnn"] = bf._sdpa(q, k, v, causal, "cudnn")
    t = time_rounds(fns, 5, timer=timer)
    for name, times in t.items():
        if isinstance(times, Exception):
            print(f"d{d} {seqlen} {name}: {times}")
            continue
        r = speed_ratio(times, t["cudnn"])
        print(f"d{d} {batch}x{seqlen} {'causal' if causal else 'full':6s} {name:24s} "
              f"{bf._tflops(batch, heads, seqlen, d, causal, median_ms(times)):6.1f} TFLOP/s  /cudnn {r[0]:.3f} "
              f"(rounds {r[1]:.3f}-{r[2]:.3f})", flush=True)
    del q, k, v, fns
    torch.cuda.empty_cache()
