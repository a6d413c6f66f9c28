import pytest
import torch


def pytest_collection_modifyitems(config, items):
    """GPU tests skip cleanly where CUDA (or pycuda) is absent."""
    has_cuda = torch.cuda.is_available()
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
