"""pytest integration: fixtures and the ``equivariance`` marker.

Add two lines to your ``conftest.py``::

    pytest_plugins = ["est.testing.pytest_plugin"]

and use the fixtures::

    @pytest.mark.equivariance(dtypes=("float32", "float64"))
    def test_my_layer(equivariance_dtype, float_tolerance, rotations):
        layer = MyLayer()  # checked on a copy cast to equivariance_dtype (est.testing's default: float64)
        assert_equivariant(layer, lmax=2, dtype=equivariance_dtype, tol=float_tolerance, rotations=rotations)

Fixtures:
    ``equivariance_dtype``: ``torch.float64``, or each of the marker's ``dtypes``.
    ``float_tolerance``: the default relative tolerance for that dtype (float64
        1e-10, float32 1e-4), or the marker's ``tol=``.
    ``equivariance_seed``: a seed that is stable per test (from its node id),
        or the marker's ``seed=``.
    ``rotations``: ``[n, 3, 3]`` float64 Haar-random rotations from that seed
        (``n`` = the marker's ``num_rotations=``, default 8).

Marker ``@pytest.mark.equivariance(dtypes=..., tol=..., seed=..., num_rotations=...)``
labels the test (``pytest -m equivariance`` runs only these) and sets the
fixtures above.
"""
from __future__ import annotations

import zlib

import pytest
import torch

from est.so3 import random_rotation

from ._report import default_tolerance

_MARKER_DOC = (
    "equivariance(dtypes=None, tol=None, seed=None, num_rotations=8): equivariance checks from est.testing; "
    "dtypes parametrizes the equivariance_dtype fixture"
)


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", _MARKER_DOC)


def _marker_kwargs(node) -> dict:
    m = node.get_closest_marker("equivariance")
    return dict(m.kwargs) if m is not None else {}


def _as_dtype(d) -> torch.dtype:
    if isinstance(d, torch.dtype):
        return d
    dt = getattr(torch, str(d).replace("torch.", ""), None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"equivariance marker: unknown dtype {d!r}; use e.g. 'float32' or torch.float64")
    return dt


def pytest_generate_tests(metafunc) -> None:
    if "equivariance_dtype" not in metafunc.fixturenames:
        return
    m = metafunc.definition.get_closest_marker("equivariance")
    dtypes = m.kwargs.get("dtypes") if m is not None else None
    if dtypes:
        ds = [_as_dtype(d) for d in dtypes]
        metafunc.parametrize("equivariance_dtype", ds, ids=[str(d).replace("torch.", "") for d in ds], indirect=True)


@pytest.fixture
def equivariance_dtype(request) -> torch.dtype:
    """The dtype under test: ``torch.float64`` unless the marker lists ``dtypes``."""
    return _as_dtype(getattr(request, "param", torch.float64))


@pytest.fixture
def float_tolerance(request) -> float:
    """Relative tolerance for ``equivariance_dtype`` when the test uses it, else torch's default dtype."""
    kw = _marker_kwargs(request.node)
    if kw.get("tol") is not None:
        return float(kw["tol"])
    if "equivariance_dtype" in request.fixturenames:
        dtype = request.getfixturevalue("equivariance_dtype")
    else:
        dtype = torch.get_default_dtype()
    return default_tolerance(dtype).rtol


@pytest.fixture
def equivariance_seed(request) -> int:
    """Stable per test: crc32 of the node id (without parameters), or the marker's ``seed``."""
    kw = _marker_kwargs(request.node)
    if kw.get("seed") is not None:
        return int(kw["seed"])
    return zlib.crc32(request.node.nodeid.split("[")[0].encode()) & 0x7FFFFFFF


@pytest.fixture
def rotations(request, equivariance_seed) -> torch.Tensor:
    """``[n, 3, 3]`` float64 random rotations, seeded by ``equivariance_seed``."""
    n = int(_marker_kwargs(request.node).get("num_rotations", 8))
    gen = torch.Generator().manual_seed(equivariance_seed)
    return random_rotation(n, dtype=torch.float64, generator=gen)
