r"""Real spherical harmonics in e3nn's convention, for any degree.

For a unit vector :math:`v = (x, y, z)` with the pole on ``y``, write the
standard z-pole coordinates :math:`(x', y', z') = (z, x, y)`. Then

.. math::

    Y_{l, 0} = q_l^0(z'), \quad
    Y_{l, \pm m} = \sqrt{2}\, q_l^m(z')\, \{\mathrm{Re}, \mathrm{Im}\}(x' + i y')^m,

with :math:`q_l^m = \sqrt{(2l+1)\,(l-m)!/(l+m)!}\; P_l^m / \sin^m\theta`
(associated Legendre functions without the Condon-Shortley phase, divided by
:math:`\sin^m\theta`, hence polynomials in :math:`z'`). This is e3nn's
``normalization="component"``: :math:`\sum_m Y_{lm}(v)^2 = 2l+1` and the mean
of :math:`Y_{lm}^2` over the sphere is 1. Everything is a polynomial of the
coordinates, so gradients are finite everywhere, poles included.

Recurrences (all stable in float32 up to l ~ 40):
:math:`q_m^m = q_{m-1}^{m-1}\sqrt{(2m+1)/(2m)}`,
:math:`q_{m+1}^m = \sqrt{2m+3}\, z' q_m^m`,
:math:`q_l^m = a_{lm} z' q_{l-1}^m - b_{lm} q_{l-2}^m` with
:math:`a_{lm} = \sqrt{(4l^2-1)/(l^2-m^2)}`,
:math:`b_{lm} = \sqrt{(2l+1)((l-1)^2-m^2)/((2l-3)(l^2-m^2))}`.
"""
from __future__ import annotations

import math

import torch

from ._layout import check_lmax

__all__ = ["spherical_harmonics"]

_UNIT_TOL = {torch.float64: 1e-6, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 2e-2}


def _check_vectors(vectors: torch.Tensor, normalize: bool) -> None:
    if not isinstance(vectors, torch.Tensor):
        raise TypeError(f"vectors must be a torch.Tensor, got {type(vectors).__name__}")
    if vectors.dim() < 1 or vectors.shape[-1] != 3:
        raise ValueError(f"vectors must have shape [..., 3], got {tuple(vectors.shape)}")
    if not vectors.is_floating_point():
        raise ValueError(f"vectors must be floating point, got {vectors.dtype}")
    if vectors.numel() == 0:
        return
    with torch.no_grad():
        bad = ~torch.isfinite(vectors).all(dim=-1)
        if bool(bad.any()):
            first = tuple(int(i) for i in bad.nonzero()[0])
            raise ValueError(f"vectors contain NaN or inf (first at index {first})")
        norms = vectors.norm(dim=-1)
        if normalize:
            if bool((norms == 0).any()):
                raise ValueError("vectors contain a zero vector, which has no direction")
        else:
            err = (norms - 1).abs()
            tol = _UNIT_TOL.get(vectors.dtype, 1e-4)
            if bool((err > tol).any()):
                first = tuple(int(i) for i in (err > tol).nonzero()[0])
                raise ValueError(
                    f"vectors must be unit vectors (|v| = {float(norms[first]):.6g} at index {first}); "
                    "pass normalize=True to normalise them"
                )


def spherical_harmonics(
    lmax: int, vectors: torch.Tensor, *, normalize: bool = False, validate: bool = True
) -> torch.Tensor:
    """Real spherical harmonics of degrees ``0..lmax`` at unit vectors.

    Args:
        lmax: maximum degree L (any non-negative integer).
        vectors: ``[..., 3]`` unit vectors (float32 or float64).
        normalize: divide ``vectors`` by their norm first.
        validate: check for NaN and non-unit vectors (one host sync; switch
            off in hot loops whose inputs are known good).

    Returns:
        ``[..., (lmax+1)^2]``, l-major, e3nn's component normalisation;
        equals ``e3nn.o3.spherical_harmonics(range(lmax+1), v, False, "component")``.

    Example:
        >>> v = torch.tensor([[0.0, 1.0, 0.0]])
        >>> spherical_harmonics(1, v)
        tensor([[1.0000, 0.0000, 1.7321, 0.0000]])
    """
    check_lmax(lmax)
    if validate:
        _check_vectors(vectors, normalize)
    if normalize:
        vectors = vectors / vectors.norm(dim=-1, keepdim=True)
    xp, yp, zp = vectors[..., 2], vectors[..., 0], vectors[..., 1]  # z-pole frame, each [...]

    # q[l][m] polynomials in zp, m = 0..l
    q: list[list[torch.Tensor]] = []
    one = torch.ones_like(zp)
    diag = one
    for l in range(lmax + 1):
        row = []
        for m in range(l + 1):
            if m == l:
                if l > 0:
                    diag = diag * math.sqrt((2 * m + 1) / (2 * m))
                row.append(diag)
            elif m == l - 1:
                row.append(math.sqrt(2 * m + 3) * zp * q[l - 1][m])
            else:
                a = math.sqrt((4 * l * l - 1) / (l * l - m * m))
                b = math.sqrt((2 * l + 1) * ((l - 1) ** 2 - m * m) / ((2 * l - 3) * (l * l - m * m)))
                row.append(a * zp * q[l - 1][m] - b * q[l - 2][m])
        q.append(row)

    # (xp + i yp)^m = A_m + i B_m
    re, im = [one], [torch.zeros_like(zp)]
    for m in range(1, lmax + 1):
        re.append(xp * re[-1] - yp * im[-1])
        im.append(yp * re[-2] + xp * im[-1])

    out = []
    sqrt2 = math.sqrt(2.0)
    for l in range(lmax + 1):
        for m in range(-l, l + 1):
            if m < 0:
                out.append(sqrt2 * q[l][-m] * im[-m])
            elif m == 0:
                out.append(q[l][0])
            else:
                out.append(sqrt2 * q[l][m] * re[m])
    return torch.stack(out, dim=-1)  # [..., K]
