r"""Point sets on the unit sphere and their quadrature weights.

Every function returns ``(points [S, 3], weights [S])`` in float64, unit
vectors with the pole on ``y`` (e3nn's convention), weights summing to
:math:`4\pi` so that :math:`\int_{S^2} f \approx \sum_s w_s f(p_s)`.

Kinds and what they integrate exactly (L = maximum degree of the features):

============== ================================ ===================================
kind           points                           exact for
============== ================================ ===================================
fibonacci      golden-angle spiral (EST paper)  nothing (error falls slowly with S)
gauss-legendre GL latitudes x equispaced lon.   degree <= 2 n_lat - 1 (round trip
                                                exact for n_lat >= L+1, n_lon >= 2L+1)
equiangular    e3nn's ToS2Grid grid,            round trip exact for
               Kostelec-Rockmore weights        res_beta >= 2(L+1), res_alpha >= 2L+1
design         spherical t-design, 4pi/S each   every polynomial of degree <= t
                                                (round trip exact for t >= 2L)
============== ================================ ===================================
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ..so3._layout import check_lmax

__all__ = [
    "KINDS",
    "sphere_points",
    "fibonacci_points",
    "gauss_legendre_points",
    "equiangular_points",
    "design_points",
    "relax_points",
    "default_num_points",
]

KINDS = ("fibonacci", "gauss-legendre", "equiangular", "design")


def default_num_points(lmax: int) -> int:
    """The EST paper's default size ``S = (2L+1)(2L+2)`` (182 for L=6)."""
    return (2 * lmax + 1) * (2 * lmax + 2)


def _equal_weights(n: int) -> torch.Tensor:
    return torch.full((n,), 4 * math.pi / n, dtype=torch.float64)


def relax_points(points: torch.Tensor, steps: int, *, step_size: float = 0.05) -> torch.Tensor:
    r"""Spread points by Coulomb-like repulsion, re-projecting onto the sphere.

    Each step moves :math:`p_i \leftarrow \mathrm{normalize}(p_i + \eta
    \sum_j (p_i - p_j)/|p_i - p_j|^3)` with :math:`\eta` = ``step_size`` times
    the cube of the mean spacing :math:`\sqrt{4\pi/S}`, so a step moves a point
    by about ``step_size`` of the spacing.
    """
    p = points.to(torch.float64).clone()
    n = p.shape[0]
    eta = step_size * (4 * math.pi / n) ** 1.5
    for _ in range(steps):
        diff = p[:, None, :] - p[None, :, :]  # [S, S, 3]
        dist = diff.norm(dim=-1).fill_diagonal_(float("inf"))  # [S, S]
        force = (diff / dist[..., None] ** 3).sum(dim=1)  # [S, 3]
        p = p + eta * force
        p = p / p.norm(dim=-1, keepdim=True)
    return p


def fibonacci_points(num_points: int, *, relax_steps: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The EST paper's Fibonacci lattice (released-code form, polar axis ``y``).

    :math:`y_i = 1 - 2i/(S-1)`, :math:`r_i = \sqrt{1-y_i^2}`,
    :math:`\theta_i = i\pi(3-\sqrt5)`, :math:`p_i = (r_i\cos\theta_i, y_i, r_i\sin\theta_i)`;
    equal weights :math:`4\pi/S`. ``relax_steps > 0`` applies :func:`relax_points`.
    """
    if num_points < 2:
        raise ValueError(f"fibonacci lattice needs at least 2 points, got {num_points}")
    i = torch.arange(num_points, dtype=torch.float64)
    y = 1 - 2 * i / (num_points - 1)
    r = torch.sqrt((1 - y * y).clamp_min(0))
    theta = i * math.pi * (3 - math.sqrt(5))
    p = torch.stack([r * torch.cos(theta), y, r * torch.sin(theta)], dim=-1)  # [S, 3]
    if relax_steps:
        p = relax_points(p, relax_steps)
    return p, _equal_weights(num_points)


def _lat_lon_grid(cos_lat: torch.Tensor, lat_weights: torch.Tensor, n_lon: int, lon_offset: float = 0.0):
    """Points ``(sin b sin a, cos b, sin b cos a)``, latitude-major, and weights."""
    alpha = lon_offset + 2 * math.pi * torch.arange(n_lon, dtype=torch.float64) / n_lon  # [A]
    sin_lat = torch.sqrt((1 - cos_lat**2).clamp_min(0))  # [B]
    p = torch.stack(
        [
            sin_lat[:, None] * torch.sin(alpha)[None, :],
            cos_lat[:, None].expand(-1, n_lon),
            sin_lat[:, None] * torch.cos(alpha)[None, :],
        ],
        dim=-1,
    ).reshape(-1, 3)  # [B*A, 3]
    w = (lat_weights[:, None] * (2 * math.pi / n_lon)).expand(-1, n_lon).reshape(-1)  # [B*A]
    return p, w


def gauss_legendre_points(n_lat: int, n_lon: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gauss-Legendre nodes in ``cos(beta)`` times ``n_lon`` equispaced longitudes."""
    if n_lat < 1 or n_lon < 1:
        raise ValueError(f"gauss-legendre grid needs n_lat, n_lon >= 1, got ({n_lat}, {n_lon})")
    x, w = np.polynomial.legendre.leggauss(n_lat)
    return _lat_lon_grid(torch.from_numpy(x[::-1].copy()), torch.from_numpy(w[::-1].copy()), n_lon)


def _kostelec_rockmore_weights(res_beta: int) -> torch.Tensor:
    r"""Weights of the equiangular latitudes :math:`\beta_j = \pi(2j+1)/(4b)`, ``res_beta = 2b``.

    :math:`w_j = \frac{2}{b}\sin\beta_j \sum_{k<b} \frac{\sin((2k+1)\beta_j)}{2k+1}`
    (Driscoll-Healy / Kostelec-Rockmore); they integrate
    :math:`\int_0^\pi f(\beta)\sin\beta\, d\beta` for band-limited f. Sum = 2.
    """
    b = res_beta // 2
    j = torch.arange(res_beta, dtype=torch.float64)
    k = torch.arange(b, dtype=torch.float64)
    beta = math.pi * (2 * j + 1) / (4 * b)  # [2b]
    series = (torch.sin((2 * k[None, :] + 1) * beta[:, None]) / (2 * k[None, :] + 1)).sum(-1)
    return (2.0 / b) * torch.sin(beta) * series


def equiangular_points(res_beta: int, res_alpha: int) -> tuple[torch.Tensor, torch.Tensor]:
    """e3nn's ``s2_grid(res_beta, res_alpha)`` points (beta-major) with quadrature weights.

    ``beta_i = pi (i + 1/2) / res_beta``, ``alpha_j = 2 pi j / res_alpha``; the
    flattening of e3nn's ``[..., res_beta, res_alpha]`` grid values.
    """
    if res_beta < 2 or res_beta % 2 or res_alpha < 1:
        raise ValueError(f"equiangular grid needs an even res_beta >= 2 and res_alpha >= 1, got ({res_beta}, {res_alpha})")
    beta = math.pi * (torch.arange(res_beta, dtype=torch.float64) + 0.5) / res_beta
    return _lat_lon_grid(torch.cos(beta), _kostelec_rockmore_weights(res_beta), res_alpha)


def design_points(degree: int, num_points: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A shipped spherical t-design of degree ``>= degree`` (see :mod:`est.sphere.designs`)."""
    from .designs import load_design

    p = torch.from_numpy(np.array(load_design(degree, num_points), dtype=np.float64))
    return p, _equal_weights(p.shape[0])


def sphere_points(
    kind: str,
    lmax: int,
    num_points: int | None = None,
    *,
    degree: int | None = None,
    resolution: tuple[int, int] | None = None,
    relax_steps: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Points ``[S, 3]`` and weights ``[S]`` (float64, sum 4 pi) for features of degree ``<= lmax``.

    Args:
        kind: ``"fibonacci"``, ``"gauss-legendre"``, ``"equiangular"`` or ``"design"``.
        lmax: maximum degree L of the features that will be sampled.
        num_points: S. Fibonacci: default ``(2L+1)(2L+2)``. Design: pick the
            shipped design with exactly S points (highest degree). Grids: must
            be ``n x (2n-1)`` (gauss-legendre) or ``n x n`` (equiangular), or use ``resolution``.
        degree: design degree t (default ``2L``: the smallest that makes the
            linear round trip exact); ignored by other kinds.
        resolution: ``(n_lat, n_lon)`` / ``(res_beta, res_alpha)`` for the grids;
            default the smallest exact one.
        relax_steps: repulsion steps for the Fibonacci lattice (0 = the paper).

    Raises:
        ValueError: unknown kind, ``lmax < 0``, or too few points for an exact kind.
    """
    check_lmax(lmax)
    if kind not in KINDS:
        raise ValueError(f"unknown sphere point kind {kind!r}; expected one of {KINDS}")
    if num_points is not None and (isinstance(num_points, bool) or not isinstance(num_points, int) or num_points < 1):
        raise ValueError(f"num_points must be a positive integer, got {num_points!r}")
    if kind == "fibonacci":
        S, K = num_points or default_num_points(lmax), (lmax + 1) ** 2
        if S < K:
            raise ValueError(
                f"a fibonacci lattice of {S} points cannot hold the K = (lmax+1)^2 = {K} coefficients of degree "
                f"<= {lmax} (the transform is rank deficient: the round trip loses part of every input); "
                f"use num_points >= {K}, better the paper's (2L+1)(2L+2) = {default_num_points(lmax)}"
            )
        return fibonacci_points(S, relax_steps=relax_steps)
    if kind == "design":
        if num_points is not None and degree is None:
            from .designs import design_for_points

            t, _ = design_for_points(num_points)
            if t < 2 * lmax:
                raise ValueError(
                    f"the shipped design with {num_points} points has degree {t} < 2*lmax = {2 * lmax}: "
                    "the round trip would not be exact; use more points or kind='fibonacci'"
                )
            return design_points(t, num_points)
        t = 2 * lmax if degree is None else degree
        if t < 2 * lmax:
            raise ValueError(f"design degree {t} is too low for lmax={lmax}: need degree >= 2*lmax = {2 * lmax}")
        return design_points(max(t, 1), num_points)
    # latitude-longitude grids
    if kind == "gauss-legendre":
        need = (lmax + 1, 2 * lmax + 1)
        family = lambda n: (n, 2 * n - 1)  # noqa: E731
    else:
        need = (2 * (lmax + 1), 2 * lmax + 1)
        family = lambda n: (n, n)  # noqa: E731
    if resolution is None and num_points is not None:
        n = next((n for n in range(1, num_points + 1) if family(n)[0] * family(n)[1] >= num_points), None)
        if n is None or family(n)[0] * family(n)[1] != num_points:
            raise ValueError(
                f"{kind} grids come in sizes n x {'(2n-1)' if kind == 'gauss-legendre' else 'n'}; "
                f"{num_points} points is not one of them: pass resolution=(n_lat, n_lon)"
            )
        resolution = family(n)
    resolution = tuple(resolution) if resolution is not None else need
    if resolution[0] < need[0] or resolution[1] < need[1]:
        raise ValueError(
            f"{kind} grid {resolution[0]} x {resolution[1]} has too few points for lmax={lmax}: "
            f"need at least {need[0]} x {need[1]} for an exact round trip"
        )
    if kind == "gauss-legendre":
        return gauss_legendre_points(*resolution)
    return equiangular_points(*resolution)
