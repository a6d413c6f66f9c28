"""The d64 unmasked walk on the GPU, one build: (1) how long a work takes with 1, 2 or 3 of its math warpgroups busy
(2816 one-tile works of 64, 128 or 192 query rows over 2048 and 4096 keys; the model's BUSY_WARPGROUPS_STEP_FLOOR);
(2) the decision room's dealt walk against the plain walk (work b of every round) at 8x2k and 4x4k, 32 heads, in
CUDA graphs, rounds in turns, outputs compared bit for bit.

    python walk_probe.py [--rounds 5]
"""
import argparse
import statistics

import torch

from hf_flashpatch.kernels import forward
from hf_flashpatch.kernels.heuristics import HopperSchedule, forward_tile_shape


def graph_ms(fn, calls=10, replays=15):
    fn()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def rand(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def launch(q, k, v, schedule=None):
    return forward._launch(q, k, v, None, None, None, None, None, False, -1, -1, None, schedule=schedule)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    print("busy warpgroups: 2816 works of one query tile each (88 sequences x 32 heads), d64, unmasked")
    for keys in (2048, 4096):
        k, v = rand(88, keys, 32, 64), rand(88, keys, 32, 64)
        times = {}
        for rows in (64, 128, 192):
            q = rand(88, rows, 32, 64)
            times[rows] = statistics.median(graph_ms(lambda: launch(q, k, v)) for _ in range(args.rounds))
        print(f"  {keys} keys: " + ", ".join(f"{r // 64} busy {t * 1e3:7.1f} us ({t / times[192]:.3f})"
                                            for r, t in times.items()))
        del k, v
    print("dealt / plain walk, d64 unmasked, 32 heads, 16k tokens")
    for batch, seqlen in ((8, 2048), (4, 4096), (2, 8192)):
        q, k, v = rand(batch, seqlen, 32, 64), rand(batch, seqlen, 32, 64), rand(batch, seqlen, 32, 64)
        shape = forward_tile_shape(64, "sm_90a", False)
        count = -(-seqlen // shape.block_m)
        from hf_flashpatch.kernels.heuristics import hopper_forward_schedule

        chosen = hopper_forward_schedule(seqlen, seqlen, 1, shape.block_m, shape.block_n, -1, -1, batch * 32, 132,
                                         False, seqlen * 256, shape.own_key_tiles)
        plain = HopperSchedule(132)
        out_d, lse_d = launch(q, k, v, chosen)
        out_p, lse_p = launch(q, k, v, plain)
        same = torch.equal(out_d, out_p) and torch.equal(lse_d, lse_p)
        ratios, dealt_us, plain_us = [], [], []
        for r in range(args.rounds):
            pair = [("dealt", chosen), ("plain", plain)]
            if r % 2:
                pair.reverse()
            t = {name: graph_ms(lambda s=s: launch(q, k, v, s)) for name, s in pair}
            ratios.append(t["dealt"] / t["plain"])
            dealt_us.append(t["dealt"] * 1e3)
            plain_us.append(t["plain"] * 1e3)
        listed = chosen.listed is not None
        print(f"  {batch}x{seqlen // 1024}k ({count} tiles a pair, listed {listed}, modelled "
              f"{chosen.listed.makespan if listed else 0:.1f}): dealt {statistics.median(dealt_us):7.1f} us, plain "
              f"{statistics.median(plain_us):7.1f} us, dealt / plain {statistics.median(ratios):.3f} "
              f"({min(ratios):.3f}-{max(ratios):.3f}), bits equal {same}")


if __name__ == "__main__":
    main()
