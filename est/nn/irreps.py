r"""Conversion between est's layout and e3nn ``Irreps`` layouts.

est: ``[N, K, C]`` (coefficient-major). e3nn: ``[N, irreps.dim]`` with one
``C x l`` block per degree, each block multiplicity-major (``[C, 2l+1]``
flattened). Parities default to those of spherical harmonics,
:math:`p = (-1)^l` (``"0e + 1o + 2e + ..."``), as for features built from
relative positions. Both conventions share e3nn's real basis, so the
conversion is a pure reshape.
"""
from __future__ import annotations

import torch
from e3nn import o3

from ..so3._layout import check_lmax, num_coefficients

__all__ = ["irreps_for", "to_e3nn", "from_e3nn"]


def irreps_for(lmax: int, channels: int, *, parity: str = "sh") -> o3.Irreps:
    """``"Cx0e+Cx1o+Cx2e+..."`` (``parity="sh"``), or all even (``"even"``)."""
    check_lmax(lmax)
    if parity not in ("sh", "even"):
        raise ValueError(f"parity must be 'sh' or 'even', got {parity!r}")
    return o3.Irreps([(channels, (l, (-1) ** l if parity == "sh" else 1)) for l in range(lmax + 1)])


def to_e3nn(x: torch.Tensor) -> torch.Tensor:
    """``[N, K, C] -> [N, irreps.dim]`` in the layout of :func:`irreps_for`."""
    if x.dim() != 3:
        raise ValueError(f"to_e3nn: expected [N, K, C], got {tuple(x.shape)}")
    lmax = int(round(x.shape[1] ** 0.5)) - 1
    if num_coefficients(max(lmax, 0)) != x.shape[1]:
        raise ValueError(f"to_e3nn: K={x.shape[1]} is not (L+1)^2")
    blocks = [x[:, l * l : (l + 1) ** 2].transpose(1, 2).flatten(1) for l in range(lmax + 1)]  # [N, C*(2l+1)]
    return torch.cat(blocks, dim=1)


def from_e3nn(y: torch.Tensor, irreps: o3.Irreps | str) -> torch.Tensor:
    """``[N, irreps.dim] -> [N, K, C]``; irreps must be ``C x l`` for ``l = 0..L`` in order."""
    irreps = o3.Irreps(irreps)
    muls = {mul for mul, _ in irreps}
    ls = [ir.l for _, ir in irreps]
    if len(muls) != 1 or ls != list(range(len(ls))):
        raise ValueError(
            f"from_e3nn: irreps {irreps} must have one block per degree l = 0..L in order with equal "
            "multiplicity (e.g. '8x0e+8x1o+8x2e'); simplify() or reorder them first"
        )
    if y.shape[-1] != irreps.dim:
        raise ValueError(f"from_e3nn: tensor has {y.shape[-1]} features but irreps {irreps} has dim {irreps.dim}")
    (C,) = muls
    blocks = [b.unflatten(-1, (C, 2 * l + 1)).transpose(1, 2) for l, b in zip(ls, y.split([C * (2 * l + 1) for l in ls], dim=-1))]
    return torch.cat(blocks, dim=1)  # [N, K, C]
