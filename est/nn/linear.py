r"""Per-degree linear maps of irreps features.

:math:`y_{lm} = W_l x_{lm}` (+ :math:`b` for l = 0 only) with one weight
matrix per degree shared by all orders m: equivariant because it mixes
channels, never coefficients.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..so3._layout import check_lmax, degree_index, num_coefficients

__all__ = ["DegreeLinear"]


class DegreeLinear(nn.Module):
    """``[N, K, C_in] -> [N, K, C_out]``; weight ``[L+1, C_out, C_in]``, bias on l=0."""

    def __init__(self, *, lmax: int, in_channels: int, out_channels: int, bias: bool = True) -> None:
        super().__init__()
        self.lmax, self.in_channels, self.out_channels = check_lmax(lmax), in_channels, out_channels
        bound = 1 / math.sqrt(in_channels)
        self.weight = nn.Parameter(torch.empty(lmax + 1, out_channels, in_channels).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None
        self.register_buffer("degree", degree_index(lmax), persistent=False)

    def extra_repr(self) -> str:
        return f"lmax={self.lmax}, in_channels={self.in_channels}, out_channels={self.out_channels}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        K = num_coefficients(self.lmax)
        if x.dim() != 3 or x.shape[1] != K or x.shape[2] != self.in_channels:
            raise ValueError(f"DegreeLinear: expected [N, {K}, {self.in_channels}], got {tuple(x.shape)}")
        # contract channel by channel per degree block: one matmul per degree. split / unbind rather than
        # slicing: their backward is one cat / stack, where each slice's backward would zero-fill and copy a
        # gradient of the whole input (L + 1 times; ~1/4 of the EST default block's time at L = 6)
        blocks = x.split([2 * l + 1 for l in range(self.lmax + 1)], dim=1)  # (L+1) x [N, 2l+1, C_in]
        outs = [xl @ w.T for xl, w in zip(blocks, self.weight.unbind(0))]  # (L+1) x [N, 2l+1, C_out]
        if self.bias is not None:
            outs[0] = outs[0] + self.bias  # l = 0 only: a bias on l > 0 would break equivariance
        return torch.cat(outs, dim=1)  # [N, K, C_out]
