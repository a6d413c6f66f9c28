"""Why a training call's backward costs more host time inside autograd than its body alone: the stream each launch
sees (a non-zero handle takes the side-stream fork in build.Kernel.launch), the thread it runs on, the collector's
runs, and the call's host time with the collector off and with autograd's device threads off (backward on the
calling thread). GQA 32/8, d64, 1 x 128, causal, bf16, as profile_host.py --training."""
import gc
import threading
import time

import torch

import hf_flashpatch as hfp
from hf_flashpatch.kernels import build

q, k, v = (torch.randn(1, 128, h, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for h in (32, 8, 8))
grad = torch.randn(1, 128, 32, 64, device="cuda", dtype=torch.bfloat16)


def call():
    hfp.flash_attn_func(q, k, v, causal=True).backward(grad)


def host_us(n=300):
    for _ in range(5):
        call()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        call()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed * 1e6 / n


seen = []
real_launch = build.Kernel.launch


def launch(self, *args, **kwargs):
    seen.append((self.entry, build._current_raw_stream(self.device_index), threading.current_thread() is threading.main_thread()))
    return real_launch(self, *args, **kwargs)


build.Kernel.launch = launch
call()
build.Kernel.launch = real_launch
for entry, stream, main in seen:
    print(f"launch {entry:28s} raw stream {stream:#x} main thread {main}")
collections = []
gc.callbacks.append(lambda phase, info: phase == "start" and collections.append(info["generation"]))
rows = [("fwd+bwd", host_us())]
print(f"collections in 305 calls: {len(collections)} (by generation {[collections.count(g) for g in range(3)]})")
gc.disable()
rows.append(("fwd+bwd, gc disabled", host_us()))
gc.enable()
with torch.autograd.set_multithreading_enabled(False):
    rows.append(("fwd+bwd, backward on the calling thread", host_us()))
rows.append(("fwd+bwd again", host_us()))
for name, us in rows:
    print(f"{name:45s} {us:8.1f} us")
