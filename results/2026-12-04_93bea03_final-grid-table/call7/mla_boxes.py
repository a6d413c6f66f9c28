"""192/128 forward with and without the output boxes, one process, CUDA-graph kernel time in turns (a quick A/B)."""
import dataclasses
import statistics
import torch
from hf_flashpatch.kernels import forward
from hf_flashpatch.kernels.heuristics import forward_tile_shape

torch.manual_seed(0)
shape = forward_tile_shape(192, "sm_90a", False, 128)
shapes = {"boxes": shape, "threads": dataclasses.replace(shape, tma_output=False)}
for batch, seqlen, causal in [(4, 4096, True), (4, 4096, False), (8, 2048, False), (1, 16384, True)]:
    q = torch.randn(batch, seqlen, 16, 192, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, seqlen, 16, 192, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(batch, seqlen, 16, 128, device="cuda", dtype=torch.bfloat16)
    right = 0 if causal else -1
    graphs, outs = {}, {}
    for name, s in shapes.items():
        call = lambda s=s: forward._launch(q, k, v, None, None, None, None, None, causal, -1, right, None, shape=s)
        outs[name] = call()[0]
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(10):
                call()
        graphs[name] = g
    times = {name: [] for name in shapes}
    for _ in range(7):
        for name, g in graphs.items():
            g.replay()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(5):
                g.replay()
            end.record()
            torch.cuda.synchronize()
            times[name].append(start.elapsed_time(end) / 50)
    ratio = [b / t for b, t in zip(times["boxes"], times["threads"])]
    print(f"192/128 {batch}x{seqlen} {'causal' if causal else 'full'}: boxes {statistics.median(times['boxes']):.4f} ms, "
          f"threads {statistics.median(times['threads']):.4f} ms, boxes/threads median {statistics.median(ratio):.3f} "
          f"(rounds {min(ratio):.3f}-{max(ratio):.3f}), bit-identical {torch.equal(outs['boxes'], outs['threads'])}")
