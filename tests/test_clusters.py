"""CPU checks of kernels/clusters.py: without a driver the count of co-resident
clusters is 0, so the forward launches its plain build (heuristics.clustered_schedule, whose test_kernel_scalars
case covers a count of 0) instead of failing."""

import ctypes

import pytest

from hf_flashpatch.kernels.clusters import resident_clusters


def _has_libcuda() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_has_libcuda(), reason="a driver is present: tests/gpu/test_forward_walks.py asks it for real")
def test_no_driver_counts_no_clusters():
    assert resident_clusters(b"\x7fELF not a cubin", "hfp_attention_forward_sm90_ws", 2, 384, 215136) == 0

