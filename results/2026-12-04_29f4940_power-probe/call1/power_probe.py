"""Clock and power of the GPU while one implementation runs back to back (nvidia-smi sampled every 20 ms), for ours
and cuDNN on the benchmark's rows: is the kernel at the power limit, and at what clock?"""
import subprocess, sys, time, statistics
sys.path.insert(0, "scripts")
import torch
import bench_forward as bf
import bench_backward as bb

def probe(name, fn, flops, seconds=1.5):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    log = open(f"/tmp/smi_{name}.csv", "w")
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu",
                            "--format=csv,noheader,nounits", "-lms", "20"], stdout=log)
    time.sleep(0.3)
    calls, t0 = 0, time.time()
    start = torch.cuda.Event(enable_timing=True); end = torch.cuda.Event(enable_timing=True)
    start.record()
    while time.time() - t0 < seconds:
        for _ in range(5):
            fn()
        calls += 5
        torch.cuda.synchronize()
    end.record(); torch.cuda.synchronize()
    ms = start.elapsed_time(end) / calls
    smi.terminate(); smi.wait(); log.close()
    rows = [l.split(",") for l in open(f"/tmp/smi_{name}.csv") if l.count(",") == 3]
    rows = rows[len(rows) // 5 : -2]  # the steady middle
    clock = statistics.median(float(r[1]) for r in rows)
    power = statistics.median(float(r[2]) for r in rows)
    temp = statistics.median(float(r[3]) for r in rows)
    tflops = flops / ms / 1e9
    print(f"{name:34s} {ms:8.3f} ms {tflops:7.1f} TFLOP/s  sm clock {clock:6.0f} MHz  power {power:6.1f} W  "
          f"{temp:4.0f} C  {tflops * 1e3 / power:6.2f} GFLOP/J  ({len(rows)} samples)", flush=True)

print(subprocess.run(["nvidia-smi", "--query-gpu=power.limit,power.max_limit,clocks.max.sm,clocks.sm",
                      "--format=csv"], capture_output=True, text=True).stdout)
for seqlen in (2048, 16384):
    batch, heads, q, k, v = bf._inputs(seqlen, 128)
    flops = 4 * batch * heads * seqlen * seqlen * 128
    probe(f"fwd d128 {batch}x{seqlen} full ours", bf._ours(q, k, v, False), flops)
    probe(f"fwd d128 {batch}x{seqlen} full cudnn", bf._sdpa(q, k, v, False, "cudnn"), flops)
batch, heads, q, k, v = bf._inputs(2048, 64)
flops = 4 * batch * heads * 2048 * 2048 * 64 / 2
probe("fwd d64 8x2048 causal ours", bf._ours(q, k, v, True), flops)
probe("fwd d64 8x2048 causal cudnn", bf._sdpa(q, k, v, True, "cudnn"), flops)
for seqlen, causal in ((2048, False), (16384, True)):
    batch, heads, q, k, v, dout = bb._inputs(seqlen, 128)
    flops = 2.5 * 4 * batch * heads * seqlen * seqlen * 128 / (2 if causal else 1)
    probe(f"bwd d128 {batch}x{seqlen} {'causal' if causal else 'full'} ours", bb._ours(q, k, v, dout, causal, False), flops)
    probe(f"bwd d128 {batch}x{seqlen} {'causal' if causal else 'full'} cudnn", bb._sdpa(q, k, v, dout, causal, "cudnn"), flops)
