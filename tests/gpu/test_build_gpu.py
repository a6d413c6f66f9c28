"""The PyCUDA launch layer on a real GPU: primary context, stream ordering, graph capture, threads."""

import threading

import pytest
import torch

pytestmark = pytest.mark.gpu


def _axpy(spin: int = 20000):
    from hf_flashpatch.kernels.build import KernelBuild, get_kernel

    return get_kernel(KernelBuild("selftest.cu", (("SELFTEST_SPIN", str(spin)),)), "selftest_axpy",
                      torch.device("cuda"))


def _launch(kernel, y, x, alpha):
    n = y.numel()
    kernel(((n + 255) // 256, 1, 1), (256, 1, 1), y, x, alpha, n, tensors=(y, x))


def test_default_stream_ordering():
    kernel = _axpy()
    x = torch.randn(1 << 20, device="cuda")
    y = torch.randn(1 << 20, device="cuda")
    expected = 2.0 * x + (y + 1)
    y += 1  # queued before the kernel on torch's stream
    _launch(kernel, y, x, 2.0)
    y *= 1.0  # queued after
    torch.testing.assert_close(y, expected)


def test_side_stream_ordering():
    kernel = _axpy()
    side = torch.cuda.Stream()
    x = torch.randn(1 << 20, device="cuda")
    with torch.cuda.stream(side):
        y = torch.full((1 << 20,), 3.0, device="cuda")  # produced on the side stream
        _launch(kernel, y, x, -1.0)
        z = y * 2  # consumed on the side stream right after the kernel
    torch.cuda.synchronize()
    torch.testing.assert_close(z, 2 * (3.0 - x))


def test_cuda_graph_capture_and_replay():
    kernel = _axpy(spin=10)
    x = torch.randn(4096, device="cuda")
    y = torch.zeros(4096, device="cuda")
    _launch(kernel, y, x, 1.0)  # warm up outside the capture (module load)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y.zero_()
        _launch(kernel, y, x, 0.5)
        y.mul_(2)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.testing.assert_close(y, x)


def test_launch_from_a_background_thread():
    kernel = _axpy(spin=10)
    x = torch.randn(1000, device="cuda")
    y = torch.zeros(1000, device="cuda")
    errors = []

    def work():
        try:
            _launch(kernel, y, x, 3.0)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert not errors, errors
    torch.testing.assert_close(y, 3 * x)
