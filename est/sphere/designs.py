"""Shipped spherical t-designs (equal-weight quadrature on the sphere).

A spherical t-design is a set of N unit vectors p_1..p_N with

    (1/N) sum_s f(p_s) = (1/4pi) int_{S^2} f(p) dOmega(p)     for every polynomial f of degree <= t,

i.e. the equal weights 4pi/N integrate every spherical harmonic of degree <= t exactly.
Equivalently the residual vector

    r_lm = sum_s Y_lm(p_s),   l = 1..t, m = -l..l   (orthonormal Y; r_00 = N / sqrt(4pi) exactly)

vanishes; by the Legendre addition theorem
|r|^2 = sum_{l=1..t} (2l+1)/(4pi) sum_{s,s'} P_l(p_s . p_s'), independent of the orientation
and of the (orthonormal, real or complex) harmonic basis.

For band-limited features of degree <= L on the grid, a design with t >= 2L makes the spherical
Fourier round trip x -> F = Y x -> (4pi/N) Y^T F exact (the Gram matrix
(4pi/N) sum_s Y_k(p_s) Y_k'(p_s) integrates a product of degree <= 2L), and t >= 3L also
integrates the quadratic terms of a pointwise nonlinearity exactly (docs: est-method.md, sec. 2).

The table ``data/designs.npz`` is produced by ``scripts/make_designs.py`` (float64, L-BFGS on the
addition-theorem energy, then trust-region least squares on r). Each design is stored as
``t{t}_n{N}`` -> float64 [N, 3]; arrays ``t``, ``n`` and ``residual`` (|r| re-measured
independently with scipy's complex harmonics, ~1e-15..5e-13) list them. Designs are in an
arbitrary orientation; rotate them freely (any rotation of a t-design is a t-design).
"""
from __future__ import annotations

import functools
import os

import numpy as np

__all__ = ["available_designs", "load_design", "design_for_points", "design_torch", "DESIGNS_PATH"]

DESIGNS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "designs.npz")


@functools.lru_cache(maxsize=1)
def _table() -> dict:
    """Read the npz once: {(t, N): read-only float64 [N, 3]} and {(t, N): residual}."""
    if not os.path.exists(DESIGNS_PATH):
        raise FileNotFoundError(
            f"spherical design table not found at {DESIGNS_PATH}; regenerate it with "
            "`python scripts/make_designs.py` or reinstall est with its package data"
        )
    points: dict[tuple[int, int], np.ndarray] = {}
    residuals: dict[tuple[int, int], float] = {}
    with np.load(DESIGNS_PATH) as data:
        for t, n, r in zip(data["t"].tolist(), data["n"].tolist(), data["residual"].tolist()):
            p = np.array(data[f"t{t}_n{n}"], dtype=np.float64)  # [N, 3]
            p.setflags(write=False)
            points[(int(t), int(n))] = p
            residuals[(int(t), int(n))] = float(r)
    return {"points": points, "residual": residuals}


def available_designs() -> list[tuple[int, int, float]]:
    """All shipped designs as (t, N, residual |r|), sorted by t then N."""
    res = _table()["residual"]
    return [(t, n, res[(t, n)]) for (t, n) in sorted(res)]


def _sizes() -> str:
    return ", ".join(f"(t={t}, N={n})" for t, n, _ in available_designs())


def load_design(t: int, num_points: int | None = None) -> np.ndarray:
    """A shipped spherical design of degree >= ``t`` as unit vectors, float64 [N, 3] (read-only).

    Without ``num_points``: the design with the fewest points among those of degree >= t (ties:
    the higher degree). With ``num_points``: a design with exactly that many points and degree
    >= t (the highest such degree). Equal weights 4pi/N then integrate degree <= t exactly.

    Raises ValueError naming the request and listing the shipped (t, N) when nothing fits.
    """
    t = int(t)
    if t < 0:
        raise ValueError(f"design degree t must be >= 0, got {t}")
    pts = _table()["points"]
    cands = [(tt, n) for (tt, n) in pts if tt >= max(t, 1)]
    if num_points is not None:
        num_points = int(num_points)
        cands = [(tt, n) for (tt, n) in cands if n == num_points]
        if not cands:
            raise ValueError(
                f"no shipped spherical design with exactly N={num_points} points and degree >= {t}; "
                f"shipped designs: {_sizes()}. Pick one of these sizes, lower t, or regenerate with "
                "scripts/make_designs.py"
            )
        key = max(cands)  # highest degree with that N
    else:
        if not cands:
            tmax = max(tt for tt, _ in pts)
            raise ValueError(
                f"no shipped spherical design of degree >= {t} (highest shipped degree is {tmax}); "
                f"shipped designs: {_sizes()}. Lower t or extend scripts/make_designs.py --tmax"
            )
        key = min(cands, key=lambda k: (k[1], -k[0]))
    return pts[key]


def design_for_points(num_points: int) -> tuple[int, np.ndarray]:
    """The highest-degree shipped design with exactly ``num_points`` points: (t, float64 [N, 3]).

    Raises ValueError listing the shipped (t, N) when no design has that many points.
    """
    num_points = int(num_points)
    pts = _table()["points"]
    cands = [(t, n) for (t, n) in pts if n == num_points]
    if not cands:
        raise ValueError(
            f"no shipped spherical design with N={num_points} points; shipped designs: {_sizes()}. "
            "Use one of these sizes (e.g. the (2L+1)(2L+2) sizes 30, 56, 90, 132, 182, 240, 306) "
            "or regenerate with scripts/make_designs.py"
        )
    key = max(cands)
    return key[0], pts[key]


def design_torch(t: int, num_points: int | None = None, dtype=None, device=None):
    """``load_design`` as a torch tensor [N, 3] (default dtype float64; a fresh copy)."""
    import torch

    p = load_design(t, num_points)
    return torch.tensor(p, dtype=dtype or torch.float64, device=device)
