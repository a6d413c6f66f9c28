"""Is the backward's body slower on autograd's device thread because it is another thread, or because of the engine?
Host time of the backward's body (backward._backward_fn, grad mode off) in a loop on the main thread and on a plain
Python thread; of a pure-Python loop (no torch call) likewise; and of a no-op autograd Function whose backward runs
that Python loop, with autograd's device threads on and off. Shapes as diag.py."""
import threading
import time

import torch

from hf_flashpatch.kernels import backward, forward

q, k, v = (torch.randn(1, 128, h, 64, device="cuda", dtype=torch.bfloat16) for h in (32, 8, 8))
grad = torch.randn(1, 128, 32, 64, device="cuda", dtype=torch.bfloat16)
scale = 64**-0.5
out, lse = forward._launch(q, k, v, None, None, 0, 0, scale, True, -1, -1, 0.0)
ctx = type("Ctx", (), {"saved_tensors": (q, k, v, out, lse, None, None), "attrs": (128, 128, scale, -1, 0, 0.0, False)})()


def body():
    with torch.no_grad():
        backward._backward_fn(ctx, grad, None)


def python_only():
    total = 0
    for i in range(2000):
        total += i * i
    return total


def loop_us(fn, n=300):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed * 1e6 / n


def on_thread(fn):
    result = []
    thread = threading.Thread(target=lambda: result.append(loop_us(fn)))
    thread.start()
    thread.join()
    return result[0]


class PythonBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        python_only()
        return g


x = torch.randn(1, 128, 32, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
rows = [("backward body, main thread", loop_us(body)), ("backward body, another thread", on_thread(body)),
        ("python loop, main thread", loop_us(python_only)), ("python loop, another thread", on_thread(python_only)),
        ("Function with python-loop backward", loop_us(lambda: PythonBackward.apply(x).backward(grad)))]
with torch.autograd.set_multithreading_enabled(False):
    rows.append(("  the same, backward on the calling thread", loop_us(lambda: PythonBackward.apply(x).backward(grad))))
for name, us in rows:
    print(f"{name:45s} {us:8.1f} us")
