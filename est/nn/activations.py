r"""Equivariant activations of irreps features (EquiformerV2's set).

* :class:`SmoothLeakyReLU`: :math:`f(x) = x\big(\tfrac{1+a}{2} + \tfrac{1-a}{2}\tanh\tfrac{x}{2}\big)`
  (equal to EquiformerV2's :math:`\tfrac{1+a}{2}x + \tfrac{1-a}{2}x(2\sigma(x)-1)`).
* :class:`S2GridActivation`: pointwise SiLU of the function on the sphere,
  :math:`x \mapsto B\,\mathrm{SiLU}(A x)` with the sampling matrix
  :math:`A_{sk} = Y_k(p_s)` and the quadrature projection
  :math:`B_{ks} = w_s Y_k(p_s) / 4\pi` (:func:`est.sphere.transform_matrices`).
* :class:`SeparableS2Activation`: the l=0 output is SiLU of separate gate
  scalars (exactly invariant); l>0 come from :class:`S2GridActivation`.
* :class:`GateActivation`: :math:`y_0 = \mathrm{SiLU}(x_0)`,
  :math:`y_{l>0} = \sigma(g_l) \odot x_{l}` with one gate per (degree, channel).

Layouts: ``mmax=None`` means node features in the full l-major layout
``[N, K, C]``; an integer ``mmax`` means edge-frame features in the m-major
layout truncated to :math:`|m| \le M` (``[E, K_M, C]``,
:func:`est.so3.m_major_index`). For the latter the grid matrices are the
columns/rows of the full ones at ``m_major_index`` (no zero padding), which is
what EquiformerV2's ``SO3_Grid(lmax, mmax)`` does.

Equivariance: sampling, a pointwise function and projection commute with
rotations only as far as the quadrature is exact; the error is aliasing of
the products of degree > L that SiLU creates, so it shrinks with finer grids
(``tests/test_message.py`` measures it). Gates and the l=0 path are exact.

Grid normalisation (e3nn's ``ToS2Grid`` names): the grid function is
:math:`f = \sum_{l,m} n_l\, x_{lm} Y_{lm}` with the component-normalised
harmonics of :mod:`est.so3` and the projection divides by :math:`n_l` again:
``"component"`` :math:`n_l = 1/\sqrt{(2l+1)(L+1)}` (what EquiformerV2's
``SO3_Grid`` uses), ``"integral"`` :math:`n_l = 1/\sqrt{4\pi}`, ``"norm"``
:math:`n_l = 1/\sqrt{L+1}`, ``"none"`` :math:`n_l = 1`. The choice matters
because SiLU is not homogeneous.

``truncation_rescale`` (m-major only): multiply degrees :math:`l > M` by
:math:`s_l = \sqrt{(2l+1)/(2M+1)}` in both :math:`A` and :math:`B`, as
EquiformerV2 does (so a linear activation would scale them by :math:`s_l^2`).
"""
from __future__ import annotations


import torch
from torch import nn

from ..so3 import degree_index, m_major_index, num_coefficients, split_scalar
from ..so3._layout import check_lmax
from ..sphere import DEGREE_SCALINGS, degree_scale, sphere_points, transform_matrices
from .edges import m_major_degrees
from .edges import truncation_rescale as _degree_rescale

__all__ = ["SmoothLeakyReLU", "S2GridActivation", "SeparableS2Activation", "GateActivation", "GRID_NORMALIZATIONS"]

GRID_NORMALIZATIONS = DEGREE_SCALINGS  # the grid amplitude conventions (est.sphere.degree_scale)


class SmoothLeakyReLU(nn.Module):
    r""":math:`f(x) = x\,(\tfrac{1+a}{2} + \tfrac{1-a}{2}\tanh(x/2))`: slope ``a`` for
    :math:`x\to-\infty`, 1 for :math:`x\to+\infty`, smooth everywhere."""

    def __init__(self, negative_slope: float = 0.2) -> None:
        super().__init__()
        self.negative_slope = negative_slope

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.negative_slope
        return x * (0.5 * (1 + a) + 0.5 * (1 - a) * torch.tanh(0.5 * x))


def _layout(lmax: int, mmax: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions in the l-major layout [K'], degree per row [K'])."""
    if mmax is None:
        return torch.arange(num_coefficients(lmax)), degree_index(lmax)
    return m_major_index(lmax, mmax), m_major_degrees(lmax, mmax)


def _check(x: torch.Tensor, rows: int, channels: int | None, name: str, layout: str) -> None:
    if x.dim() != 3 or x.shape[1] != rows or (channels is not None and x.shape[2] != channels):
        c = "C" if channels is None else str(channels)
        raise ValueError(f"{name}: expected features [*, {rows}, {c}] ({layout}), got {tuple(x.shape)}")


class S2GridActivation(nn.Module):
    """SiLU on a sphere grid, all degrees: ``forward(x [*, K', C]) -> [*, K', C]``.

    Args (keyword-only):
        lmax: L. mmax: ``None`` (l-major, K' = (L+1)^2) or M (m-major ``|m| <= M``).
        grid_kind, grid_resolution, grid_num_points: the point set
            (:func:`est.sphere.sphere_points`); EquiformerV2: ``"equiangular"``, ``(18, 18)``.
        grid_normalization: ``"component"`` (EquiformerV2), ``"integral"``, ``"norm"`` or ``"none"``.
        truncation_rescale: EquiformerV2's l>M rescale (m-major layout only).

    Buffers ``to_grid [S, K']`` and ``from_grid [K', S]`` are float64 and
    non-persistent; they are cast to the input dtype on use.
    """

    def __init__(
        self,
        *,
        lmax: int,
        mmax: int | None = None,
        grid_kind: str = "equiangular",
        grid_resolution: tuple[int, int] | None = (18, 18),
        grid_num_points: int | None = None,
        grid_normalization: str = "component",
        truncation_rescale: bool = True,
    ) -> None:
        super().__init__()
        check_lmax(lmax)
        if mmax is not None and not 0 <= mmax <= lmax:
            raise ValueError(f"S2GridActivation: mmax must be None or in 0..lmax={lmax}, got {mmax}")
        if grid_normalization not in GRID_NORMALIZATIONS:
            raise ValueError(
                f"S2GridActivation: unknown grid_normalization {grid_normalization!r}; expected {GRID_NORMALIZATIONS}"
            )
        self.lmax, self.mmax, self.grid_kind, self.grid_normalization = lmax, mmax, grid_kind, grid_normalization
        resolution = grid_resolution if grid_kind in ("equiangular", "gauss-legendre") else None
        points, weights = sphere_points(grid_kind, lmax, grid_num_points, resolution=resolution)
        A, B = transform_matrices(lmax, points, weights, "quadrature")  # [S, K], [K, S] float64
        index, degree = _layout(lmax, mmax)
        A, B = A[:, index], B[index, :]  # [S, K'], [K', S]
        n = degree_scale(grid_normalization, lmax)[degree]  # [K'] n_l
        A, B = A * n, B / n[:, None]
        if mmax is not None and truncation_rescale:
            s = _degree_rescale(lmax, mmax)  # [K'] s_l
            A, B = A * s, B * s[:, None]
        self.num_rows = index.numel()
        self.register_buffer("to_grid", A.contiguous(), persistent=False)
        self.register_buffer("from_grid", B.contiguous(), persistent=False)
        self.act = nn.SiLU()

    @property
    def num_points(self) -> int:
        return self.to_grid.shape[0]

    def extra_repr(self) -> str:
        return (
            f"lmax={self.lmax}, mmax={self.mmax}, grid_kind={self.grid_kind!r}, num_points={self.num_points}, "
            f"grid_normalization={self.grid_normalization!r}"
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check(x, self.num_rows, None, type(self).__name__, self._layout_name())
        f = self.to_grid.to(x.dtype) @ x  # [*, S, C]
        return self.from_grid.to(x.dtype) @ self.act(f)  # [*, K', C]

    def _layout_name(self) -> str:
        return f"l-major lmax={self.lmax}" if self.mmax is None else f"m-major lmax={self.lmax}, mmax={self.mmax}"



class SeparableS2Activation(nn.Module):
    r"""``forward(gates [*, C], x [*, K', C]) -> [*, K', C]``:
    :math:`y_0 = \mathrm{SiLU}(g)`, :math:`y_{l>0} = [B\,\mathrm{SiLU}(A x)]_{l>0}`.

    Keyword arguments as :class:`S2GridActivation` (row 0 of both layouts is l=0).
    """

    def __init__(self, **grid_kwargs) -> None:
        super().__init__()
        self.grid = S2GridActivation(**grid_kwargs)
        self.scalar_act = nn.SiLU()

    def forward(self, gates: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if gates.dim() != 2 or gates.shape[0] != x.shape[0] or gates.shape[1] != x.shape[-1]:
            raise ValueError(
                f"{type(self).__name__}: gates must be [E, C] matching x [E, K', C], got gates "
                f"{tuple(gates.shape)} and x {tuple(x.shape)}"
            )
        y = self.grid(x)  # [*, K', C]
        return torch.cat([self.scalar_act(gates)[:, None, :], split_scalar(y)[1]], dim=1)


class GateActivation(nn.Module):
    r"""``forward(gates [*, L*C], x [*, K', C]) -> [*, K', C]``:
    :math:`y_0 = \mathrm{SiLU}(x_0)`, :math:`y_{l,m,c} = \sigma(g_{l,c})\, x_{l,m,c}` for l >= 1.

    ``gates`` are ordered (l = 1..L) x channel. Layout as :class:`S2GridActivation`.
    """

    def __init__(self, *, lmax: int, channels: int, mmax: int | None = None) -> None:
        super().__init__()
        check_lmax(lmax)
        if lmax < 1:
            raise ValueError("GateActivation needs lmax >= 1 (there is nothing to gate at lmax=0)")
        self.lmax, self.mmax, self.channels = lmax, mmax, channels
        _, degrees = _layout(lmax, mmax)
        self.register_buffer("gate_index", degrees[1:] - 1, persistent=False)  # [K'-1] gate row for each l>0 row
        self.num_rows = degrees.numel()

    def extra_repr(self) -> str:
        return f"lmax={self.lmax}, mmax={self.mmax}, channels={self.channels}"

    def forward(self, gates: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        name = type(self).__name__
        _check(x, self.num_rows, self.channels, name, f"lmax={self.lmax}, mmax={self.mmax}")
        if gates.shape != (x.shape[0], self.lmax * self.channels):
            raise ValueError(f"{name}: gates must be [E, L*C={self.lmax * self.channels}], got {tuple(gates.shape)}")
        g = torch.sigmoid(gates).view(-1, self.lmax, self.channels)  # [E, L, C]
        g = g.index_select(1, self.gate_index)  # [E, K'-1, C]
        x0, xr = split_scalar(x)  # [E, 1, C], [E, K'-1, C]
        return torch.cat([nn.functional.silu(x0), xr * g], dim=1)
