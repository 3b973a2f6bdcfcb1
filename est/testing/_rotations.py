r"""Rotations for equivariance checks: axis-angle maps and a worst-case search.

A check evaluates an error ``e(R)`` (a non-negative number, larger is worse)
at rotations ``R``. Random (Haar) rotations estimate the *typical* error;
defects that only show up near particular rotations (an Euler-angle
singularity at ``beta = 0`` or ``pi``, a layer equivariant about one axis only)
need a search for the *worst* one. :func:`search_worst_rotation` draws

1. a few special rotations: ``pi`` and ``pi/2`` turns about ``x``, ``y``, ``z``
   and about a body diagonal (``R_x(pi)`` is the ``beta = pi`` Euler singularity,
   rotations about ``y`` the ``beta = 0`` one),
2. ``num_random`` Haar-random rotations,

then refines the worst one by a pattern search on the axis-angle vector: it
tries ``R' = exp(s * [e_k]_x) R`` for the six signed coordinate axes ``e_k``
and a step ``s`` that starts at ``initial_step`` and halves whenever no
direction improves. Every evaluated rotation is handed to the objective, so
callers record statistics on the fly (typical errors from the random phase
only, the maximum over everything).
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch

from est.so3 import random_rotation

__all__ = [
    "axis_angle_to_matrix",
    "matrix_to_axis_angle",
    "describe_rotation",
    "special_rotations",
    "search_worst_rotation",
    "SearchResult",
]


def axis_angle_to_matrix(vec: torch.Tensor) -> torch.Tensor:
    r"""Rodrigues: rotation vector ``[..., 3]`` (axis times angle) to ``[..., 3, 3]``.

    .. math:: R = I + \sin\theta\,[n]_\times + (1 - \cos\theta)\,[n]_\times^2.
    """
    theta = vec.norm(dim=-1, keepdim=True)  # [..., 1]
    n = vec / theta.clamp_min(1e-300)  # [..., 3]
    x, y, z = n.unbind(-1)
    o = torch.zeros_like(x)
    K = torch.stack([o, -z, y, z, o, -x, -y, x, o], dim=-1).unflatten(-1, (3, 3))  # [..., 3, 3]
    s, c = torch.sin(theta)[..., None], torch.cos(theta)[..., None]
    eye = torch.eye(3, dtype=vec.dtype, device=vec.device).expand_as(K)
    return eye + s * K + (1 - c) * (K @ K)


def matrix_to_axis_angle(R: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(axis [..., 3] unit, angle [...] in [0, pi])`` of rotation matrices ``[..., 3, 3]``.

    Uses the antisymmetric part away from ``angle = pi`` and the symmetric part
    (``sym(R) - cos(t) I = (1 - cos t) n n^T``) near it; the axis of the identity is ``+z``.
    """
    tr = R.diagonal(dim1=-2, dim2=-1).sum(-1)
    angle = torch.acos(((tr - 1) / 2).clamp(-1.0, 1.0))  # [...]
    w = torch.stack([R[..., 2, 1] - R[..., 1, 2], R[..., 0, 2] - R[..., 2, 0], R[..., 1, 0] - R[..., 0, 1]], -1)
    S = (R + R.transpose(-1, -2)) / 2 - torch.eye(3, dtype=R.dtype, device=R.device) * torch.cos(angle)[..., None, None]
    # sym(R) - cos(t) I = (1 - cos t) n n^T: near pi its largest column is parallel to n
    col = S.norm(dim=-2).argmax(-1)  # [...]
    n_pi = torch.gather(S, -1, col[..., None, None].expand(*S.shape[:-1], 1)).squeeze(-1)
    n_pi = n_pi * torch.sign((n_pi * w).sum(-1, keepdim=True) + 1e-300)
    use_pi = angle > 3.0
    axis = torch.where(use_pi[..., None], n_pi, w)
    norm = axis.norm(dim=-1, keepdim=True)
    fallback = torch.tensor([0.0, 0.0, 1.0], dtype=R.dtype, device=R.device).expand_as(axis)
    axis = torch.where(norm > 1e-12, axis / norm.clamp_min(1e-300), fallback)
    return axis, angle


def describe_rotation(R: torch.Tensor) -> str:
    """One line: axis, angle in degrees and the matrix rows of a (proper or improper) ``[3, 3]``."""
    R = R.detach().to(torch.float64).cpu()
    det = float(torch.linalg.det(R))
    proper = R if det > 0 else -R
    axis, angle = matrix_to_axis_angle(proper)
    rows = "[" + ", ".join("[" + ", ".join(f"{v:+.4f}" for v in row) + "]" for row in R.tolist()) + "]"
    a = ", ".join(f"{v:+.3f}" for v in axis.tolist())
    pre = "" if det > 0 else "inversion times "
    return f"{pre}rotation about axis ({a}) by {math.degrees(float(angle)):.1f} deg; matrix {rows}"


def special_rotations(dtype=torch.float64, device=None) -> torch.Tensor:
    """``[14, 3, 3]``: half and quarter turns about x, y, z and the (1,1,1) diagonal, and two tiny angles.

    Half turns about ``x`` (or ``z``) put Euler ``beta`` at ``pi``; turns about
    ``y`` put it at 0 (the two gimbal singularities of ``R_y R_x R_y``).
    """
    d = 1 / math.sqrt(3)
    vecs = []
    for axis in ([1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]):
        for angle in (math.pi, math.pi / 2, -math.pi / 2):
            vecs.append([a * angle for a in axis])
    vecs += [[d * math.pi] * 3, [d * 2 * math.pi / 3] * 3, [1e-7, 0.0, 0.0], [0.0, 0.0, 1e-7]]
    return axis_angle_to_matrix(torch.tensor(vecs, dtype=dtype, device=device))


class SearchResult(NamedTuple):
    """Outcome of :func:`search_worst_rotation`."""

    rotation: torch.Tensor  # [3, 3] worst rotation found
    value: float  # objective there
    num_evaluations: int


def search_worst_rotation(
    objective: Callable[[torch.Tensor, str], float],
    *,
    num_random: int = 16,
    refine_steps: int = 24,
    initial_step: float = 0.4,
    min_step: float = 1e-3,
    special: bool = True,
    candidates: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    dtype=torch.float64,
    improper: bool = False,
) -> SearchResult:
    """Maximise ``objective(R, phase)`` over rotations; see the module docstring.

    Args:
        objective: called with ``R [3, 3]`` (float64) and ``phase`` in
            ``{"special", "random", "refine", "given"}``; returns the error.
        num_random: Haar-random rotations (the typical-error sample).
        refine_steps: objective evaluations spent on the local pattern search.
        candidates: ``[M, 3, 3]`` rotations to use instead of the special and
            random ones (e.g. rotations about one axis only).
        improper: evaluate ``-R`` instead of ``R`` (O(3) parity checks).
    """
    sign = -1.0 if improper else 1.0
    evals = 0
    best_R, best_v = None, -math.inf

    def ev(R: torch.Tensor, phase: str) -> float:
        nonlocal evals, best_R, best_v
        evals += 1
        v = float(objective(sign * R, phase))
        if math.isnan(v):
            v = math.inf
        if v > best_v:
            best_R, best_v = R, v
        return v

    if candidates is not None:
        for R in candidates.to(dtype):
            ev(R, "given")
        return SearchResult(sign * best_R, best_v, evals)
    if special:
        for R in special_rotations(dtype):
            ev(R, "special")
    for R in random_rotation(num_random, dtype=dtype, generator=generator):
        ev(R, "random")
    # local refinement of the worst: coordinate pattern search on the rotation vector
    step, spent = initial_step, 0
    while spent < refine_steps and step >= min_step and math.isfinite(best_v) and best_v > 0:
        improved = False
        centre = best_R
        for k in range(3):
            for s in (1.0, -1.0):
                if spent >= refine_steps:
                    break
                d = torch.zeros(3, dtype=dtype)
                d[k] = s * step
                before = best_v
                ev(axis_angle_to_matrix(d) @ centre, "refine")
                spent += 1
                improved |= best_v > before
        if not improved:
            step /= 2
    return SearchResult(sign * best_R, best_v, evals)
