r"""Per-edge frames shared by every message-passing layer of one forward pass.

Each edge :math:`j \to i` gets the rotation :math:`R_{ij}` of
:func:`est.geometry.edge_rotation` (``R @ unit(edge_vec) = +y``, e3nn's
pole) and its real Wigner-D :math:`D(R_{ij})`, which maps global-frame
coefficients to the edge frame: :math:`Y(R v) = D(R) Y(v)`. In the edge frame
the SO(2) convolution only needs orders :math:`|m| \le M`, so we keep those rows
in the m-major order of :func:`est.so3.m_major_index`
(``D_m = D[:, m_major_index(L, M), :]``, ``[E, K_M, K]``):

.. math::
    x^{\text{edge}} = D_m\, x \quad [E, K_M, C], \qquad
    x^{\text{global}} = D_m^{\top}\, (s \odot y^{\text{edge}}) \quad [E, K, C].

:math:`s` is an optional per-degree rescale of the truncated degrees
(EquiformerV2 multiplies degrees :math:`l > M` by
:math:`\sqrt{(2l+1)/(2M+1)}` on the way back, since only :math:`2M+1` of their
:math:`2l+1` orders were kept); :func:`truncation_rescale` builds it.

The Wigner-D keeps its autograd graph (forces can be :math:`-\partial E/\partial x`)
and there is no random roll about the edge axis: two identical calls give
identical frames. The frame is computed once per forward and passed to all layers.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..geometry import edge_rotation
from ..so3 import degree_index, m_major_index, num_coefficients, wigner_D
from ..so3._layout import check_lmax

__all__ = ["EdgeFrame", "build_edge_frame", "check_frame", "truncation_rescale", "m_major_degrees"]


def m_major_degrees(lmax: int, mmax: int) -> torch.Tensor:
    """Degree ``l`` of every row of the m-major ``|m| <= mmax`` layout, long ``[K_M]``."""
    return degree_index(lmax)[m_major_index(lmax, mmax)]


def truncation_rescale(lmax: int, mmax: int, dtype=torch.float64) -> torch.Tensor:
    r"""``[K_M]`` factors :math:`\sqrt{(2l+1)/(2M+1)}` for rows of degree :math:`l > M`, else 1."""
    l = m_major_degrees(lmax, mmax).to(dtype)
    scale = torch.sqrt((2 * l + 1) / (2 * mmax + 1))
    return torch.where(l > mmax, scale, torch.ones_like(scale))


class EdgeFrame(NamedTuple):
    """Geometry of the graph as the message-passing layers see it.

    Attributes:
        edge_index: long ``[2, E]``; row 0 = source j, row 1 = target i.
        D_m: ``[E, K_M, K]`` global -> edge frame, rows ``|m| <= mmax`` in m-major order.
        edge_scalars: ``[E, R]`` rotation-invariant edge features (e.g. Gaussian basis).
        num_nodes: N, the number of atoms (targets are ``0..N-1``).
        lmax, mmax: degrees of ``D_m``.
        envelope: ``[E]`` smooth-cutoff weights in [0, 1], or ``None`` (no envelope).
        atomic_numbers: long ``[N]`` element index per atom (for element-aware
            edge scalars), or ``None``.
    """

    edge_index: torch.Tensor
    D_m: torch.Tensor
    edge_scalars: torch.Tensor
    num_nodes: int
    lmax: int
    mmax: int
    envelope: torch.Tensor | None = None
    atomic_numbers: torch.Tensor | None = None

    @property
    def num_edges(self) -> int:
        return self.edge_index.shape[1]

    def to_edge(self, x: torch.Tensor) -> torch.Tensor:
        """Per-edge global features ``[E, K, C]`` -> edge frame, m-major, ``[E, K_M, C]``."""
        return torch.bmm(self.D_m, x)  # [E, K_M, C]

    def to_global(self, y: torch.Tensor, rescale: torch.Tensor | None = None) -> torch.Tensor:
        """Edge-frame m-major ``[E, K_M, C]`` -> global l-major ``[E, K, C]``.

        ``rescale``: optional ``[K_M]`` row factors (see :func:`truncation_rescale`).
        """
        if rescale is not None:
            y = y * rescale.to(y.dtype)[:, None]  # [E, K_M, C]
        return torch.bmm(self.D_m.transpose(1, 2), y)  # [E, K, C]

    def gather_edges(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Node features ``[N, ...]`` -> (source, target) features ``[E, ...]`` each."""
        return x.index_select(0, self.edge_index[0]), x.index_select(0, self.edge_index[1])

    def scatter_targets(self, m: torch.Tensor) -> torch.Tensor:
        """Sum edge messages ``[E, ...]`` into their targets: ``[N, ...]``."""
        out = m.new_zeros((self.num_nodes, *m.shape[1:]))
        return out.index_add_(0, self.edge_index[1], m)


def build_edge_frame(
    edge_index: torch.Tensor,
    edge_vec: torch.Tensor,
    *,
    lmax: int,
    mmax: int,
    num_nodes: int,
    radial_basis: torch.nn.Module | None = None,
    edge_scalars: torch.Tensor | None = None,
    atomic_numbers: torch.Tensor | None = None,
    roll: torch.Tensor | None = None,
) -> EdgeFrame:
    r"""Compute :class:`EdgeFrame` once per forward.

    Args:
        edge_index: long ``[2, E]`` (source, target), e.g. from ``radius_graph``.
        edge_vec: ``[E, 3]`` vector from target to source (image); keeps its graph.
        lmax, mmax: degrees of the features and of the SO(2) truncation (``0 <= mmax <= lmax``).
        num_nodes: N.
        radial_basis: module ``r [E] -> [E, R]`` (e.g. :class:`~est.nn.radial.GaussianRadialBasis`);
            if it has a non-``None`` attribute ``envelope`` (``r [E] -> [E]``), the frame carries it.
        edge_scalars: precomputed ``[E, R]`` instead of ``radial_basis`` (no envelope then).
        atomic_numbers: optional long ``[N]`` stored for element-aware layers.
        roll: optional angles ``[E]``: turn each edge frame about its own axis (the
            pole), :math:`R \leftarrow R_y(\gamma) R` (still ``R u = +y``). The layers are
            equivariant under any roll, so a random roll at every training call (as
            fairchem's EquiformerV2 does) is a data augmentation of the grid aliasing.
    """
    check_lmax(lmax)
    if not 0 <= mmax <= lmax:
        raise ValueError(f"build_edge_frame: mmax must be in 0..lmax={lmax}, got {mmax}")
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"build_edge_frame: edge_index must be [2, E], got {tuple(edge_index.shape)}")
    E = edge_index.shape[1]
    if edge_vec.shape != (E, 3):
        raise ValueError(f"build_edge_frame: edge_vec must be [E={E}, 3], got {tuple(edge_vec.shape)}")
    if (radial_basis is None) == (edge_scalars is None):
        raise ValueError("build_edge_frame: pass exactly one of radial_basis= or edge_scalars=")
    if E > 0 and (int(edge_index.min()) < 0 or int(edge_index.max()) >= num_nodes):
        raise ValueError(f"build_edge_frame: edge_index has entries outside 0..num_nodes-1={num_nodes - 1}")
    if atomic_numbers is not None and atomic_numbers.shape != (num_nodes,):
        raise ValueError(
            f"build_edge_frame: atomic_numbers must be [num_nodes={num_nodes}], got {tuple(atomic_numbers.shape)}"
        )
    edge_len = torch.linalg.vector_norm(edge_vec, dim=-1)  # [E]
    envelope = None
    if radial_basis is not None:
        edge_scalars = radial_basis(edge_len)  # [E, R]
        env = getattr(radial_basis, "envelope", None)
        envelope = env(edge_len) if env is not None else None  # [E]
    elif edge_scalars.dim() != 2 or edge_scalars.shape[0] != E:
        raise ValueError(f"build_edge_frame: edge_scalars must be [E={E}, R], got {tuple(edge_scalars.shape)}")
    R = edge_rotation(edge_vec)  # [E, 3, 3]
    if roll is not None:
        R = torch.bmm(_pole_turn(roll.to(R.dtype)), R)  # [E, 3, 3]
    D = wigner_D(lmax, R, check=False)  # [E, K, K] (R built by edge_rotation: a rotation)
    D_m = D.index_select(1, m_major_index(lmax, mmax, device=D.device))  # [E, K_M, K]
    return EdgeFrame(edge_index, D_m, edge_scalars, int(num_nodes), lmax, mmax, envelope, atomic_numbers)


def _pole_turn(angle: torch.Tensor) -> torch.Tensor:
    """Rotations about +y by ``angle [E]``: ``[E, 3, 3]``."""
    c, s = torch.cos(angle), torch.sin(angle)  # [E]
    one, zero = torch.ones_like(c), torch.zeros_like(c)
    return torch.stack([c, zero, s, zero, one, zero, -s, zero, c], dim=-1).view(-1, 3, 3)


def check_frame(frame: EdgeFrame, lmax: int, mmax: int, name: str) -> None:
    """Raise ``ValueError`` if ``frame`` was built for other degrees than a layer's."""
    if frame.lmax != lmax or frame.mmax != mmax:
        raise ValueError(
            f"{name}: edge frame built for lmax={frame.lmax}, mmax={frame.mmax} but the layer has "
            f"lmax={lmax}, mmax={mmax}; build the frame with the layer's degrees"
        )
    K = num_coefficients(lmax)
    if frame.D_m.dim() != 3 or frame.D_m.shape[2] != K:
        raise ValueError(f"{name}: frame.D_m must be [E, K_M, {K}], got {tuple(frame.D_m.shape)}")

