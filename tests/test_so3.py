import math

import pytest
import torch
from e3nn import o3

from est.so3 import (
    angles_to_matrix,
    degree_index,
    from_m_major,
    m_major_index,
    m_major_sizes,
    matrix_to_angles,
    order_index,
    random_rotation,
    rotation_x,
    spherical_harmonics,
    to_m_major,
    wigner_D,
    wigner_D_from_angles,
)
from est.sphere import sphere_points


def unit(n, dtype=torch.float64):
    v = torch.randn(n, 3, dtype=dtype)
    return v / v.norm(dim=-1, keepdim=True)


def e3nn_D(lmax, R):
    """e3nn's D (its generators follow the default dtype, so compute it in float64)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        irreps = o3.Irreps([(1, (l, 1)) for l in range(lmax + 1)])
        return torch.stack([irreps.D_from_matrix(r) for r in R])
    finally:
        torch.set_default_dtype(old)


def test_harmonics_match_e3nn_up_to_12():
    v = unit(500)
    ours = spherical_harmonics(12, v)
    ref = o3.spherical_harmonics(list(range(13)), v, normalize=False, normalization="component")
    assert ours.shape == (500, 169)
    assert (ours - ref).abs().max() < 1e-10


@pytest.mark.parametrize("lmax", [0, 1, 7, 20])
def test_harmonics_orthonormal_under_exact_quadrature(lmax):
    points, weights = sphere_points("gauss-legendre", lmax)
    Y = spherical_harmonics(lmax, points)  # [S, K]
    gram = (Y.T * weights) @ Y / (4 * math.pi)
    assert (gram - torch.eye(Y.shape[1], dtype=Y.dtype)).abs().max() < 1e-10


def test_harmonics_batched_float32_and_grad_at_poles():
    v = unit(24, torch.float32).reshape(2, 3, 4, 3)
    assert spherical_harmonics(5, v).shape == (2, 3, 4, 36)
    assert spherical_harmonics(5, v).dtype == torch.float32
    poles = torch.tensor([[0.0, 1.0, 0.0], [0.0, -1.0, 0.0]], dtype=torch.float64, requires_grad=True)
    spherical_harmonics(6, poles).pow(2).sum().backward()
    assert torch.isfinite(poles.grad).all()
    # gradcheck on generic points
    v = unit(3).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda u: spherical_harmonics(4, u, normalize=True), (v,))


def test_harmonics_normalize_and_component_norm():
    v = torch.randn(10, 3, dtype=torch.float64) * 3
    Y = spherical_harmonics(8, v, normalize=True)
    ls = degree_index(8)
    per_l = torch.zeros(10, 9, dtype=torch.float64).index_add_(1, ls, Y**2)
    assert torch.allclose(per_l, (2 * torch.arange(9, dtype=torch.float64) + 1).expand(10, 9))


@pytest.mark.parametrize(
    "bad, match",
    [
        (torch.tensor([[1.0, 1.0, 0.0]]), "unit vectors"),
        (torch.tensor([[float("nan"), 0.0, 1.0]]), "NaN"),
        (torch.ones(4, 2), r"\[\.\.\., 3\]"),
        (torch.ones(3, dtype=torch.long), "floating point"),
    ],
)
def test_harmonics_bad_input(bad, match):
    with pytest.raises(ValueError, match=match):
        spherical_harmonics(2, bad)


def test_harmonics_bad_lmax():
    with pytest.raises(ValueError, match="lmax"):
        spherical_harmonics(-1, unit(2))


def test_wigner_matches_e3nn_and_rotates_harmonics():
    R = random_rotation(20)
    D = wigner_D(6, R)
    assert D.shape == (20, 49, 49) and D.dtype == torch.float64
    assert (D - e3nn_D(6, R)).abs().max() < 1e-10
    eye = torch.eye(49, dtype=torch.float64)
    assert (D @ D.transpose(-1, -2) - eye).abs().max() < 1e-12
    v = unit(30)
    lhs = spherical_harmonics(6, v @ R.transpose(-1, -2))  # [20, 30, K]  Y(R v)
    rhs = spherical_harmonics(6, v) @ D.transpose(-1, -2)  # [20, 30, K]  D Y(v)
    assert (lhs - rhs).abs().max() < 1e-12


def test_wigner_high_degree_and_block_structure():
    R = random_rotation(3)
    D = wigner_D(16, R)
    v = unit(10)
    assert (spherical_harmonics(16, v @ R.transpose(-1, -2)) - spherical_harmonics(16, v) @ D.transpose(-1, -2)).abs().max() < 1e-10
    ls = degree_index(16)
    off_block = ls[:, None] != ls[None, :]
    assert D[:, off_block].abs().max() == 0


def test_wigner_homomorphism_and_special_rotations():
    R1, R2 = random_rotation(5), random_rotation(5)
    assert (wigner_D(5, R1 @ R2) - wigner_D(5, R1) @ wigner_D(5, R2)).abs().max() < 1e-12
    # rotations whose pole image is (anti)parallel to the pole: Euler angles degenerate
    special = torch.stack([torch.eye(3, dtype=torch.float64), rotation_x(torch.tensor(math.pi, dtype=torch.float64))])
    v = unit(8)
    D = wigner_D(5, special)
    assert (spherical_harmonics(5, v @ special.transpose(-1, -2)) - spherical_harmonics(5, v) @ D.transpose(-1, -2)).abs().max() < 1e-12


def test_wigner_float32_and_grad():
    R = random_rotation(4, dtype=torch.float32)
    D = wigner_D(4, R)
    assert D.dtype == torch.float32
    assert (D - wigner_D(4, R.double())).abs().max() < 1e-5
    angles = [torch.rand(3, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    assert torch.autograd.gradcheck(lambda a, b, g: wigner_D_from_angles(3, a, b, g), angles)


def test_angles_roundtrip():
    R = random_rotation(50)
    assert (angles_to_matrix(*matrix_to_angles(R)) - R).abs().max() < 1e-12


def test_wigner_bad_input():
    with pytest.raises(ValueError, match=r"\[\.\.\., 3, 3\]"):
        wigner_D(2, torch.eye(4))


@pytest.mark.parametrize(
    "R, match",
    [
        (2 * torch.eye(3), r"R\[1\] is not a rotation: max\|R R\^T - I\| = 3, det R = 8"),
        (torch.diag(torch.tensor([1.0, 1.0, -1.0])), r"R\[1\] is a reflection \(det < 0\)"),
        (torch.full((3, 3), float("nan")), r"R\[1\] is not a rotation.*nan"),
    ],
)
def test_wigner_refuses_non_rotations_and_names_the_fix(R, match):
    Rs = torch.cat([torch.eye(3)[None], R[None]])  # the bad matrix second: the message names its index
    with pytest.raises(ValueError, match=match) as err:
        wigner_D(2, Rs)
    assert "torch.linalg.svd" in str(err.value) and "1 of 2 matrices" in str(err.value)
    assert wigner_D(2, Rs, check=False).shape == (2, 9, 9)  # callers that build R themselves skip the check


def test_wigner_accepts_rotations_rounded_to_float32():
    R = random_rotation(64, dtype=torch.float64).float()  # orthogonal to ~1e-7
    assert torch.isfinite(wigner_D(4, R)).all()
    assert torch.isfinite(wigner_D(4, (R * 1e6).round() / 1e6)).all()  # six printed decimals


def test_m_major_layout_roundtrip_and_truncation():
    lmax, mmax = 6, 2
    idx = m_major_index(lmax, mmax)
    assert idx.numel() == 29 == sum(m_major_sizes(lmax, mmax))
    x = torch.randn(5, 49, 3)
    y = to_m_major(x, idx)
    assert y.shape == (5, 29, 3)
    back = from_m_major(y, idx, lmax)
    keep = order_index(lmax).abs() <= mmax
    assert torch.equal(back[:, keep], x[:, keep]) and back[:, ~keep].abs().max() == 0
    ms = order_index(lmax)[idx]
    assert (ms[: lmax + 1] == 0).all() and (ms[lmax + 1 : 2 * lmax + 1] == 1).all()
    assert (ms[2 * lmax + 1 : 3 * lmax + 1] == -1).all()
    full = m_major_index(lmax)
    assert torch.equal(torch.sort(full).values, torch.arange(49))
    with pytest.raises(ValueError, match="mmax"):
        m_major_index(3, 4)


def test_wigner_gradients_exact_for_edges_along_the_pole():
    """Edges exactly along +-y (common in crystals): D's gradient must still be exact."""
    from est.geometry import edge_rotation

    edges = torch.tensor([[0.0, 1.3, 0.0], [0.0, -0.7, 0.0], [1e-9, 0.9, 0.0], [0.3, 0.2, 1.0]],
                         dtype=torch.float64, requires_grad=True)
    weights = torch.randn(16, 16, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda e: (wigner_D(3, edge_rotation(e)) * weights).sum(), (edges,))


def test_split_scalar_is_the_l0_row_and_the_rest_with_gradients():
    from est.so3 import split_scalar

    x = torch.randn(4, 9, 3, dtype=torch.float64, requires_grad=True)
    x0, rest = split_scalar(x)
    assert x0.shape == (4, 1, 3) and rest.shape == (4, 8, 3)
    assert torch.equal(torch.cat([x0, rest], dim=1), x)
    (2 * x0.sum() + 3 * rest.sum()).backward()
    expected = torch.full_like(x, 3.0)
    expected[:, 0] = 2.0
    assert torch.equal(x.grad, expected)
