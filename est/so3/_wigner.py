r"""Real Wigner-D matrices in the spherical-harmonic basis of :mod:`est.so3`.

Convention: for a rotation matrix ``R`` (acting on column vectors),
``Y(R v) = D(R) Y(v)`` with ``D`` block diagonal over degrees.

Euler angles follow e3nn: ``R = R_y(alpha) R_x(beta) R_y(gamma)``. Rotations
about the pole (``y``) are closed form in this basis: for ``m > 0``

.. math::
    D_y(\alpha)_{m,m} = D_y(\alpha)_{-m,-m} = \cos m\alpha,\quad
    D_y(\alpha)_{m,-m} = -\sin m\alpha,\quad D_y(\alpha)_{-m,m} = \sin m\alpha.

A rotation about ``x`` is conjugate to one about ``y``:
``R_x(beta) = P R_y(beta) P^T`` with ``P = R_z(-pi/2)`` (it maps ``e_y`` to
``e_x``), so ``D(R) = D_y(alpha) J D_y(beta) J^T D_y(gamma)`` with the fixed
matrix ``J = D(P)``, computed once per degree in float64 (a least squares
fit of ``Y(P v) = J Y(v)``) and cached. ``D_x(beta) = J D_y(beta) J^T`` is a
trigonometric polynomial in beta with constant coefficients, so the hot path
is one small matmul plus elementwise products over the block entries: no
``matrix_exp`` and no dense K x K products.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

from ._harmonics import spherical_harmonics
from ._layout import check_lmax, num_coefficients

__all__ = [
    "wigner_D",
    "wigner_D_from_angles",
    "matrix_to_angles",
    "angles_to_matrix",
    "random_rotation",
    "rotation_y",
    "rotation_x",
    "block_slices",
    "check_rotations",
]


def block_slices(lmax: int) -> list[slice]:
    """Slices of the degree-l blocks in the l-major layout."""
    return [slice(l * l, (l + 1) * (l + 1)) for l in range(lmax + 1)]


def rotation_y(angle: torch.Tensor) -> torch.Tensor:
    """Rotation matrices about ``y``: ``[..., 3, 3]`` from angles ``[...]``."""
    c, s = torch.cos(angle), torch.sin(angle)
    o, z = torch.ones_like(angle), torch.zeros_like(angle)
    return torch.stack([c, z, s, z, o, z, -s, z, c], dim=-1).unflatten(-1, (3, 3))


def rotation_x(angle: torch.Tensor) -> torch.Tensor:
    """Rotation matrices about ``x``: ``[..., 3, 3]`` from angles ``[...]``."""
    c, s = torch.cos(angle), torch.sin(angle)
    o, z = torch.ones_like(angle), torch.zeros_like(angle)
    return torch.stack([o, z, z, z, c, -s, z, s, c], dim=-1).unflatten(-1, (3, 3))


def angles_to_matrix(alpha: torch.Tensor, beta: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """``R_y(alpha) R_x(beta) R_y(gamma)``, ``[..., 3, 3]``."""
    return rotation_y(alpha) @ rotation_x(beta) @ rotation_y(gamma)


def _safe_atan2(y: torch.Tensor, x: torch.Tensor, eps: float) -> torch.Tensor:
    """``atan2`` whose gradient is zero (not NaN) where ``x = y = 0``."""
    small = (x * x + y * y) < eps * eps
    x_safe = torch.where(small, torch.ones_like(x), x)
    y_safe = torch.where(small, torch.zeros_like(y), y)
    return torch.atan2(y_safe, x_safe)


def matrix_to_angles(R: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Euler angles ``(alpha, beta, gamma)`` with ``R = R_y(alpha) R_x(beta) R_y(gamma)``.

    ``R e_y = (sin b sin a, cos b, sin b cos a)`` gives alpha and beta; gamma
    is read off ``R_x(-beta) R_y(-alpha) R``. Only where ``R e_y`` is exactly
    (to ``sqrt(tiny)``) along the pole is alpha set to 0, so that gamma absorbs
    the whole roll; ``atan2`` is accurate for small arguments, so rotations
    near the pole keep full precision, and gradients stay finite.
    """
    tiny = torch.finfo(R.dtype).tiny ** 0.5
    w = R[..., :, 1]  # [..., 3] image of the pole
    alpha = _safe_atan2(w[..., 0], w[..., 2], tiny)
    beta = torch.atan2(torch.sqrt(w[..., 0] ** 2 + w[..., 2] ** 2 + tiny * tiny), w[..., 1])
    M = rotation_x(-beta) @ rotation_y(-alpha) @ R  # [..., 3, 3] = R_y(gamma)
    gamma = torch.atan2(M[..., 0, 2], M[..., 0, 0])
    return alpha, beta, gamma


def random_rotation(n: int, *, dtype=torch.float64, device=None, generator=None) -> torch.Tensor:
    """``n`` uniformly (Haar) random rotation matrices ``[n, 3, 3]`` (from random unit quaternions)."""
    q = torch.randn(n, 4, dtype=dtype, device=device, generator=generator)
    q = q / q.norm(dim=-1, keepdim=True)
    w, x, y, z = q.unbind(-1)
    R = torch.stack(
        [
            1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w),
            2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w),
            2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y),
        ],
        dim=-1,
    )
    return R.unflatten(-1, (3, 3))


@functools.lru_cache(maxsize=None)
def _j_blocks(lmax: int) -> tuple[torch.Tensor, ...]:
    """``J_l = D_l(R_z(-pi/2))`` for ``l = 0..lmax`` in float64 (computed once)."""
    g = torch.Generator().manual_seed(0)
    n = 4 * (lmax + 1) ** 2 + 16
    v = torch.randn(n, 3, dtype=torch.float64, generator=g)
    v = v / v.norm(dim=-1, keepdim=True)
    P = torch.tensor([[0.0, 1.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    Y = spherical_harmonics(lmax, v, validate=False)  # [n, K]
    YP = spherical_harmonics(lmax, v @ P.T, validate=False)  # [n, K]
    blocks = []
    for sl in block_slices(lmax):
        Jt = torch.linalg.lstsq(Y[:, sl], YP[:, sl]).solution  # YP_l = Y_l J_l^T
        J = Jt.T.contiguous()
        blocks.append(torch.where(J.abs() < 1e-13, torch.zeros_like(J), J))
    return tuple(blocks)


class _Tables(NamedTuple):
    m_row: torch.Tensor  # [F] m of the row of each block entry (float64)
    m_col: torch.Tensor  # [F] m of the column
    flip_row: torch.Tensor  # [F] flat position of entry (f(i), j)
    flip_col: torch.Tensor  # [F] flat position of entry (i, f(j))
    flip_both: torch.Tensor  # [F] flat position of entry (f(i), f(j))
    dense: torch.Tensor  # [F] position of each entry in the flattened dense [K*K]
    x_basis: torch.Tensor  # [2L+1, F] D_x(beta) = [cos(n b), sin(n b)] @ x_basis


@functools.lru_cache(maxsize=None)
def _tables(lmax: int) -> _Tables:
    """Flat tables over the entries of all degree blocks (``F = sum (2l+1)^2``).

    ``D_x(beta)_{ij} = sum_k cos(m_k b) J_ik J_jk - sum_k sin(m_k b) J_ik J_{j f(k)}``
    with ``f(k)`` the ``-m`` partner of ``k``; grouping by ``n = |m_k|`` gives a
    constant basis so ``D_x(beta)`` is one small matmul.
    """
    K = num_coefficients(lmax)
    m_row, m_col, fr, fc, fb, dense = [], [], [], [], [], []
    basis = torch.zeros(2 * lmax + 1, sum((2 * l + 1) ** 2 for l in range(lmax + 1)), dtype=torch.float64)
    offset = 0
    for l, J in enumerate(_j_blocks(lmax)):
        d = 2 * l + 1
        ms = list(range(-l, l + 1))
        for a in range(d):
            for b in range(d):
                m_row.append(ms[a])
                m_col.append(ms[b])
                fa, fb_ = d - 1 - a, d - 1 - b  # position of -m inside the block
                fr.append(offset + fa * d + b)
                fc.append(offset + a * d + fb_)
                fb.append(offset + fa * d + fb_)
                dense.append((l * l + a) * K + (l * l + b))
        for k in range(d):
            n = abs(ms[k])
            basis[n, offset : offset + d * d] += torch.outer(J[:, k], J[:, k]).reshape(-1)
            if n > 0:
                sign = 1.0 if ms[k] > 0 else -1.0
                basis[lmax + n, offset : offset + d * d] -= sign * torch.outer(J[:, k], J[:, d - 1 - k]).reshape(-1)
        offset += d * d
    as_long = lambda v: torch.tensor(v, dtype=torch.long)  # noqa: E731
    return _Tables(
        m_row=torch.tensor(m_row, dtype=torch.float64),
        m_col=torch.tensor(m_col, dtype=torch.float64),
        flip_row=as_long(fr),
        flip_col=as_long(fc),
        flip_both=as_long(fb),
        dense=as_long(dense),
        x_basis=basis,
    )


@functools.lru_cache(maxsize=32)
def _tables_on(lmax: int, dtype: torch.dtype, device: torch.device) -> _Tables:
    t = _tables(lmax)
    return _Tables(*[x.to(device=device, dtype=dtype if x.is_floating_point() else x.dtype) for x in t])


def wigner_D_from_angles(
    lmax: int, alpha: torch.Tensor, beta: torch.Tensor, gamma: torch.Tensor | None = None, *, dense: bool = True
) -> torch.Tensor:
    r"""``D(R_y(alpha) R_x(beta) R_y(gamma))``, block diagonal ``[..., K, K]``.

    ``gamma=None`` means 0. With :math:`X = D_x(\beta)` (one matmul with a
    constant basis) and :math:`c_i = \cos m_i\alpha, s_i = \sin m_i\alpha`,
    :math:`c'_j = \cos m_j\gamma, s'_j = \sin m_j\gamma`:

    .. math:: D_{ij} = c_i X_{ij} c'_j + c_i X_{i\bar j} s'_j - s_i X_{\bar i j} c'_j - s_i X_{\bar i \bar j} s'_j.

    ``dense=False`` returns only the block entries, flat ``[..., F]``.
    Differentiable in the angles; dtype and device follow ``alpha``.
    """
    check_lmax(lmax)
    t = _tables_on(lmax, alpha.dtype, alpha.device)
    batch = torch.broadcast_shapes(alpha.shape, beta.shape, () if gamma is None else gamma.shape)
    n = torch.arange(lmax + 1, dtype=alpha.dtype, device=alpha.device)
    nb = beta.expand(batch)[..., None] * n  # [..., L+1]
    trig = torch.cat([torch.cos(nb), torch.sin(nb[..., 1:])], dim=-1)  # [..., 2L+1]
    X = trig @ t.x_basis  # [..., F]
    ra = alpha.expand(batch)[..., None] * t.m_row  # [..., F]
    ca, sa = torch.cos(ra), torch.sin(ra)
    Xr = X.index_select(-1, t.flip_row)
    if gamma is None:
        flat = ca * X - sa * Xr  # [..., F]
    else:
        rg = gamma.expand(batch)[..., None] * t.m_col  # [..., F]
        cg, sg = torch.cos(rg), torch.sin(rg)
        flat = ca * (X * cg + X.index_select(-1, t.flip_col) * sg) - sa * (
            Xr * cg + X.index_select(-1, t.flip_both) * sg
        )
    if not dense:
        return flat
    K = num_coefficients(lmax)
    out = flat.new_zeros(*batch, K * K)
    out = out.index_copy(-1, t.dense, flat) if out.dim() == 1 else out.index_copy(out.dim() - 1, t.dense, flat)
    return out.unflatten(-1, (K, K))

@functools.lru_cache(maxsize=None)
def _quarter_turn(lmax: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``Q = R_x(pi/2)`` and ``D(Q)^T`` (constants of :func:`wigner_D`'s near-pole path, built once)."""
    with torch.no_grad():
        Q = rotation_x(torch.tensor(math.pi / 2, dtype=dtype, device=device))  # [3, 3]
        return Q, wigner_D_from_angles(lmax, *matrix_to_angles(Q)).transpose(-1, -2).contiguous()  # [K, K]


def _rotation_tolerance(dtype: torch.dtype) -> float:
    """How far ``R R^T`` may be from ``I`` (max entry) for ``R`` to count as a rotation."""
    return max(1e-5, 10 * torch.finfo(dtype).eps)


def check_rotations(R: torch.Tensor, name: str = "wigner_D") -> None:
    r"""``ValueError`` unless every ``R [..., 3, 3]`` is a finite proper rotation.

    Checks :math:`\max_{ij} |(R R^	op - I)_{ij}| \le \max(10^{-5}, 10\,\epsilon)`
    and :math:`\det R = r_0 \cdot (r_1 	imes r_2) > 0` (NaN fails both): a few
    flops per matrix and one host sync, far below the Wigner-D itself.
    """
    with torch.no_grad():
        Rd = R.detach()
        eye = torch.eye(3, dtype=Rd.dtype, device=Rd.device)
        orth = (Rd @ Rd.transpose(-1, -2) - eye).abs().amax(dim=(-2, -1))  # [...]
        det = (Rd[..., 0, :] * torch.linalg.cross(Rd[..., 1, :], Rd[..., 2, :])).sum(-1)  # [...]
        bad = ~(orth <= _rotation_tolerance(Rd.dtype)) | ~(det > 0)
        if not bool(bad.any()):
            return
        idx = tuple(int(i) for i in bad.nonzero()[0])
        kind = "a reflection (det < 0)" if bool(det[idx] < 0) and bool(orth[idx] <= 1e-3) else "not a rotation"
        raise ValueError(
            f"{name}: R{list(idx)} is {kind}: max|R R^T - I| = {float(orth[idx]):.3g}, det R = {float(det[idx]):.3g} "
            f"({int(bad.sum())} of {bad.numel()} matrices affected). Pass proper rotations (orthogonal, det +1, "
            "finite): orthonormalise with U, _, Vh = torch.linalg.svd(R); R = U @ Vh, and for a reflection "
            "use -R with the parity (-1)^l applied separately"
        )


def wigner_D(lmax: int, R: torch.Tensor, *, check: bool = True) -> torch.Tensor:
    """Real Wigner-D ``[B, K, K]`` (block diagonal) for rotations ``R [B, 3, 3]``.

    ``spherical_harmonics(lmax, v @ R.T) == spherical_harmonics(lmax, v) @ D.T``,
    i.e. ``Y(R v) = D(R) Y(v)``. Matches ``e3nn.o3.Irrep(l, p).D_from_matrix``
    blockwise. Output dtype and device follow ``R``.

    ``check=True`` raises ``ValueError`` for matrices that are not finite proper
    rotations (:func:`check_rotations`: ``2 I``, a reflection, NaN); callers that
    build ``R`` themselves (edge frames, random grid rotations) pass ``check=False``.

    Example:
        >>> R = random_rotation(2)
        >>> D = wigner_D(2, R)
        >>> torch.allclose(D @ D.transpose(-1, -2), torch.eye(9, dtype=D.dtype).expand(2, 9, 9))
        True
    """
    check_lmax(lmax)
    if not isinstance(R, torch.Tensor) or R.shape[-2:] != (3, 3):
        raise ValueError(f"R must be a tensor of rotation matrices [..., 3, 3], got {getattr(R, 'shape', type(R))}")
    if not R.is_floating_point():
        raise ValueError(f"R must be floating point, got {R.dtype}")
    if check:
        check_rotations(R)
    # Near the Euler singularity (R e_y close to +-e_y) the angles' gradients
    # are ill-conditioned and exactly at it alpha's gradient is lost. There we
    # factor D(R) = D(R Q) D(Q)^T with the quarter turn Q = R_x(pi/2), whose
    # R Q e_y = R e_z lies on the equator: values and gradients stay exact.
    w = R[..., :, 1]
    near = (w[..., 0] ** 2 + w[..., 2] ** 2) < 1e-2  # sin(beta) < 0.1
    if not bool(near.any()):
        return wigner_D_from_angles(lmax, *matrix_to_angles(R))
    Q, DQt = _quarter_turn(lmax, R.dtype, R.device)  # [3, 3], [K, K]
    R_safe = torch.where(near[..., None, None], R @ Q, R)
    D = wigner_D_from_angles(lmax, *matrix_to_angles(R_safe))  # [..., K, K]
    flat = D.reshape(-1, *D.shape[-2:])
    idx = near.reshape(-1).nonzero().squeeze(-1)
    fixed = flat.index_select(0, idx) @ DQt  # [n_near, K, K]
    return flat.index_copy(0, idx, fixed).reshape(D.shape)
