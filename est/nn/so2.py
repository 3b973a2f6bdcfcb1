r"""SO(2) convolution in the edge frame (eSCN / EquiformerV2), one class for all uses.

Input: edge-frame features in the m-major layout truncated to :math:`|m| \le M`
(:func:`est.so3.m_major_index`): rows ``[m=0: l=0..L | +1: l=1..L | -1: l=1..L | ... ]``,
``x [E, K_M, C_in]``. Rotations about the edge axis (the pole :math:`y`) by
:math:`\varphi` act on the pair :math:`(x_{l,+m}, x_{l,-m})` as multiplication of
:math:`z_{l,m} = x_{l,+m} + i\,x_{l,-m}` by :math:`e^{i m\varphi}` and leave
:math:`m = 0` alone, so the most general linear map that commutes with them is

.. math::
    y_{0} = W_0\, \mathrm{vec}(x_{0}) + b, \qquad
    y_{+m} = W^{r}_m x_{+m} - W^{i}_m x_{-m},\quad
    y_{-m} = W^{r}_m x_{-m} + W^{i}_m x_{+m}\quad (m \ge 1),

where :math:`W_0` mixes all degrees and channels of the :math:`m = 0` block,
:math:`\mathrm{vec}(x_{+m})` has :math:`(L-m+1) C_{in}` entries and
:math:`W^{r}_m, W^{i}_m` map it to :math:`(L-m+1) C_{out}`. Both are one
``Linear(n C_in, 2 n C_out, bias=False)`` applied to the stacked pair and
recombined (complex multiplication as one matmul).

Radial weights (``radial_channels`` not ``None``): a :class:`~est.nn.radial.RadialMLP`
of the edge scalars gives one weight per input (m-block, l, channel),
:math:`x_{\pm m, l, c} \leftarrow w_{m, l, c}(r)\, x_{\pm m, l, c}` (the same
for :math:`+m` and :math:`-m`, which keeps the map SO(2) equivariant) before the
linear maps, exactly as eSCN/EquiformerV2. With ``radial_channels=None`` the
layer is a plain SO(2)-equivariant linear map (EquiformerV2's ``internal_weights``).

``extra_m0_channels`` extra invariant outputs of the :math:`m=0` linear map are
returned separately (attention logits, gates).

Parameters (``n_m = L - m + 1``):
:math:`(L+1) C_{in} \big((L+1) C_{out} + X\big) + (L+1) C_{out} + X
+ \sum_{m=1}^{M} 2 n_m^2 C_{in} C_{out}` plus the radial MLP
(output width :math:`C_{in} \sum_{m=0}^{M} n_m`).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from ..so3 import m_major_sizes
from ..so3._layout import check_lmax
from .radial import RadialMLP

__all__ = ["SO2Convolution"]


class SO2Convolution(nn.Module):
    """SO(2)-equivariant (radially weighted) linear map of edge-frame features.

    Args (keyword-only):
        lmax, mmax: L and the truncation M (``0 <= M <= L``).
        in_channels, out_channels: C_in, C_out.
        radial_channels: ``None`` (no radial weights) or the radial MLP's input
            and hidden sizes, e.g. ``[R + 2 E_c, E_c, E_c]`` (an ``int`` means
            ``[int]``: one Linear from the edge scalars); its output size
            ``C_in * sum_m n_m`` is appended here.
        extra_m0_channels: X extra invariant outputs of the m=0 block.

    ``forward(x [E, K_M, C_in], edge_scalars [E, R] | None) ->
    (y [E, K_M, C_out], extra [E, X] | None)``.
    """

    def __init__(
        self,
        *,
        lmax: int,
        mmax: int,
        in_channels: int,
        out_channels: int,
        radial_channels: int | Sequence[int] | None = None,
        extra_m0_channels: int = 0,
    ) -> None:
        super().__init__()
        check_lmax(lmax)
        if not 0 <= mmax <= lmax:
            raise ValueError(f"SO2Convolution: mmax must be in 0..lmax={lmax}, got {mmax}")
        if in_channels < 1 or out_channels < 1 or extra_m0_channels < 0:
            raise ValueError(
                f"SO2Convolution: need in_channels, out_channels >= 1 and extra_m0_channels >= 0, got "
                f"{in_channels}, {out_channels}, {extra_m0_channels}"
            )
        self.lmax, self.mmax = lmax, mmax
        self.in_channels, self.out_channels, self.extra_m0_channels = in_channels, out_channels, extra_m0_channels
        self.sizes = m_major_sizes(lmax, mmax)  # rows per m block: [L+1, 2 n_1, 2 n_2, ...]
        self.num_rows = sum(self.sizes)  # K_M
        n0 = lmax + 1
        self.fc_m0 = nn.Linear(n0 * in_channels, n0 * out_channels + extra_m0_channels)
        self.fc_m = nn.ModuleList()
        for m in range(1, mmax + 1):
            n = lmax - m + 1
            fc = nn.Linear(n * in_channels, 2 * n * out_channels, bias=False)
            with torch.no_grad():  # y = W_r x - W_i x' sums two products: keep its variance
                fc.weight.mul_(1 / math.sqrt(2))
            self.fc_m.append(fc)
        self.radial_sizes = [n0 * in_channels] + [(lmax - m + 1) * in_channels for m in range(1, mmax + 1)]
        self.radial = None
        if radial_channels is not None:
            hidden = [radial_channels] if isinstance(radial_channels, int) else list(radial_channels)
            self.radial = RadialMLP(channels=[*hidden, sum(self.radial_sizes)])

    def extra_repr(self) -> str:
        return (
            f"lmax={self.lmax}, mmax={self.mmax}, in_channels={self.in_channels}, "
            f"out_channels={self.out_channels}, extra_m0_channels={self.extra_m0_channels}"
        )

    def forward(
        self, x: torch.Tensor, edge_scalars: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        name = type(self).__name__
        if x.dim() != 3 or x.shape[1] != self.num_rows or x.shape[2] != self.in_channels:
            raise ValueError(
                f"{name}: expected edge-frame features [E, K_M={self.num_rows}, {self.in_channels}] "
                f"(m-major, lmax={self.lmax}, mmax={self.mmax}), got {tuple(x.shape)}"
            )
        E = x.shape[0]
        weights: list[torch.Tensor | None] = [None] * (self.mmax + 1)
        if self.radial is not None:
            if edge_scalars is None or edge_scalars.shape != (E, self.radial.in_channels):
                got = None if edge_scalars is None else tuple(edge_scalars.shape)
                raise ValueError(f"{name}: expected edge_scalars [E={E}, {self.radial.in_channels}], got {got}")
            weights = list(self.radial(edge_scalars).split(self.radial_sizes, dim=-1))  # [E, n_m C_in] each
        blocks = x.split(self.sizes, dim=1)
        C_out, X = self.out_channels, self.extra_m0_channels

        x0 = blocks[0].reshape(E, (self.lmax + 1) * self.in_channels)  # [E, (L+1) C_in] (explicit: E may be 0)
        if weights[0] is not None:
            x0 = x0 * weights[0]
        y0 = self.fc_m0(x0)  # [E, X + (L+1) C_out]
        extra = y0[:, :X] if X > 0 else None  # [E, X]
        out = [y0[:, X:].reshape(E, self.lmax + 1, C_out)]  # [E, L+1, C_out]

        for m in range(1, self.mmax + 1):
            n = self.lmax - m + 1
            xm = blocks[m].reshape(E, 2, n * self.in_channels)  # [E, (+m, -m), n C_in]
            if weights[m] is not None:
                xm = xm * weights[m][:, None, :]
            ym = self.fc_m[m - 1](xm)  # [E, 2, 2 n C_out]: [W_r x | W_i x] for x = x+, x-
            wr, wi = ym.split(n * C_out, dim=-1)  # [E, 2, n C_out] each
            y_plus = wr[:, 0] - wi[:, 1]  # W_r x+ - W_i x-
            y_minus = wr[:, 1] + wi[:, 0]  # W_r x- + W_i x+
            out.append(torch.stack([y_plus, y_minus], dim=1).reshape(E, 2 * n, C_out))  # [E, 2n, C_out]
        return torch.cat(out, dim=1), extra  # [E, K_M, C_out], [E, X] | None
