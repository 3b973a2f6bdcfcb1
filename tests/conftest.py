import pytest
import torch

from est.testing import default_dtype


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture
def float64():
    """Run a test with float64 as the default dtype, restoring it afterwards."""
    with default_dtype(torch.float64) as dtype:
        yield dtype
