"""est.testing.pytest_plugin: fixtures and marker, loaded the way users load it."""
import pytest
import torch

from est.so3 import degree_index
from est.testing import assert_equivariant

pytest_plugins = ["pytester", "est.testing.pytest_plugin"]


@pytest.mark.equivariance(dtypes=("float32", "float64"))
def test_fixtures_follow_the_marker(equivariance_dtype, float_tolerance, rotations, equivariance_seed):
    assert float_tolerance == {torch.float32: 1e-4, torch.float64: 1e-10}[equivariance_dtype]
    assert rotations.shape == (8, 3, 3) and rotations.dtype == torch.float64
    w = torch.randn(3, 4, 4, dtype=equivariance_dtype)
    layer = lambda x: torch.einsum("nkc,kcd->nkd", x, w[degree_index(2)])  # noqa: E731
    assert_equivariant(layer, lmax=2, channels=4, dtype=equivariance_dtype, tol=float_tolerance, rotations=rotations)


def test_seed_is_stable_per_test(equivariance_seed, rotations):
    import zlib

    assert equivariance_seed == zlib.crc32(b"tests/test_testing_plugin.py::test_seed_is_stable_per_test") & 0x7FFFFFFF
    gen = torch.Generator().manual_seed(equivariance_seed)
    from est.so3 import random_rotation

    assert torch.equal(rotations, random_rotation(8, generator=gen))


@pytest.mark.equivariance(tol=2e-4, seed=7, num_rotations=3)
def test_marker_overrides(float_tolerance, equivariance_seed, rotations):
    assert (float_tolerance, equivariance_seed, rotations.shape[0]) == (2e-4, 7, 3)


def test_two_line_conftest_in_a_user_project(pytester):
    pytester.makeconftest('pytest_plugins = ["est.testing.pytest_plugin"]\n')
    pytester.makepyfile(
        test_user="""
        import pytest, torch
        from est.testing import assert_equivariant

        @pytest.mark.equivariance(dtypes=["float64"])
        def test_identity(equivariance_dtype, float_tolerance, rotations):
            assert_equivariant(lambda x: 2 * x, lmax=1, dtype=equivariance_dtype, tol=float_tolerance, rotations=rotations)

        @pytest.mark.equivariance
        def test_broken(rotations):
            assert_equivariant(lambda x: x.flip(1), lmax=1, rotations=rotations)

        def test_plain():
            pass
        """
    )
    result = pytester.runpytest_inprocess("-m", "equivariance", "-p", "no:cacheprovider", "--strict-markers")
    result.assert_outcomes(passed=1, failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*rotation: output 'out' l=1*"])
