"""Shipped spherical t-designs: exactness, recorded residuals, loader API."""
import math

import numpy as np
import pytest
from scipy import special

from est.sphere import designs as D


def complex_sh(l, m, p):
    """Orthonormal complex Y_l^m at unit vectors p [N, 3] (polar axis z); l, m arrays [K, 1]."""
    polar = np.arccos(np.clip(p[:, 2], -1.0, 1.0))[None]
    azim = np.arctan2(p[:, 1], p[:, 0])[None]
    if hasattr(special, "sph_harm_y"):  # scipy >= 1.15
        return special.sph_harm_y(l, m, polar, azim)
    return special.sph_harm(m, l, azim, polar)  # older scipy: (m, l, azimuth, polar)


def residual(p, t):
    """|r| with r_lm = sum_s Y_lm(p_s), l = 1..t (basis-independent)."""
    lm = np.array([(l, m) for l in range(1, t + 1) for m in range(-l, l + 1)])
    Y = complex_sh(lm[:, :1], lm[:, 1:], p)  # [K, N]
    return float(np.linalg.norm(Y.sum(axis=1)))


def real_sh_reference(p, lmax):
    """Real orthonormal harmonics from the complex ones: [N, (lmax+1)^2]."""
    cols = []
    for l in range(lmax + 1):
        for m in range(-l, l + 1):
            y = complex_sh(np.array([[l]]), np.array([[abs(m)]]), p)[0]
            if m == 0:
                cols.append(y.real)
            elif m > 0:
                cols.append(math.sqrt(2) * (-1) ** m * y.real)
            else:
                cols.append(math.sqrt(2) * (-1) ** m * y.imag)
    return np.stack(cols, axis=1)


ALL = D.available_designs()


def test_table_covers_required_sizes():
    have = {(t, n) for t, n, _ in ALL}
    ts = {t for t, _ in have}
    assert set(range(1, 25)) <= ts, f"degrees 1..24 required, have {sorted(ts)}"
    for req in [(12, 100), (18, 182), (24, 320)]:
        assert req in have
    for L in range(2, 9):
        N = (2 * L + 1) * (2 * L + 2)
        t, p = D.design_for_points(N)
        assert p.shape == (N, 3) and t >= 2 * L - 1
    assert (1, 2) in have and (2, 4) in have and (3, 6) in have and (5, 12) in have


@pytest.mark.parametrize("t,n,res", ALL, ids=[f"t{t}_n{n}" for t, n, _ in ALL])
def test_design_exact(t, n, res):
    p = D.load_design(t, n)
    assert p.shape == (n, 3) and p.dtype == np.float64
    assert np.abs(np.linalg.norm(p, axis=1) - 1).max() < 1e-14
    r = residual(p, t)
    assert r < 1e-11, f"t={t} N={n}: |r|={r:.2e}"
    assert res < 1e-12
    # the recorded residual is a measurement at rounding level: same order as ours
    assert abs(r - res) < 1e-12


def test_roundtrip_exact_for_t_ge_2L():
    """Equal weights make the SFT round trip the identity when t >= 2L."""
    p = D.load_design(12)
    Y = real_sh_reference(p, 6)  # [N, 49]
    gram = (4 * math.pi / p.shape[0]) * Y.T @ Y
    assert np.abs(gram - np.eye(49)).max() < 1e-12


@pytest.mark.parametrize("t", [4, 9, 16, 24])
def test_polynomial_quadrature(t):
    """(4pi/N) sum_s f(p_s) = int_{S^2} f for a random polynomial f of degree t in (x, y, z)."""
    rng = np.random.default_rng(t)
    p = D.load_design(t)
    exps = [(a, b, c) for a in range(t + 1) for b in range(t + 1 - a) for c in range(t + 1 - a - b)]
    coef = rng.standard_normal(len(exps))

    def mono_integral(a, b, c):
        if a % 2 or b % 2 or c % 2:
            return 0.0
        g = math.gamma
        return 2 * g((a + 1) / 2) * g((b + 1) / 2) * g((c + 1) / 2) / g((a + b + c + 3) / 2)

    exact = sum(k * mono_integral(*e) for k, e in zip(coef, exps))
    vals = sum(k * p[:, 0] ** e[0] * p[:, 1] ** e[1] * p[:, 2] ** e[2] for k, e in zip(coef, exps))
    approx = 4 * math.pi * vals.mean()
    assert abs(approx - exact) < 1e-11 * np.abs(coef).sum(), (approx, exact)


def test_loader_selection_and_readonly():
    avail = D.available_designs()
    assert avail == sorted(avail)
    for t in range(1, max(tt for tt, _, _ in avail) + 1):
        p = D.load_design(t)
        fitting = [n for tt, n, _ in avail if tt >= t]
        assert p.shape[0] == min(fitting)
    p = D.load_design(12, 100)
    assert p.shape == (100, 3)
    with pytest.raises(ValueError):
        p[0, 0] = 2.0  # read-only: the cached array cannot be corrupted
    t, q = D.design_for_points(182)
    assert t >= 18 and q.shape == (182, 3)
    x = D.design_torch(6)
    import torch

    assert x.dtype == torch.float64 and x.shape[1] == 3


def test_loader_errors_are_clear():
    tmax = max(t for t, _, _ in D.available_designs())
    with pytest.raises(ValueError, match="degree >= 1000.*shipped designs"):
        D.load_design(1000)
    with pytest.raises(ValueError, match="exactly N=7 points"):
        D.load_design(3, 7)
    with pytest.raises(ValueError, match="N=7 points; shipped designs"):
        D.design_for_points(7)
    with pytest.raises(ValueError, match="must be >= 0"):
        D.load_design(-1)
    assert tmax >= 24
