r"""Equivariant normalisations of irreps features ``[N, K, C]``.

Both follow EquiformerV2 (``layer_norm_sh`` and ``rms_norm_sh``):

* :class:`EquivariantLayerNorm` (``"layer_norm_sh"``): the l=0 channels get an
  ordinary LayerNorm; all l>0 coefficients share one RMS scale per atom,
  :math:`\sigma^2 = \sum_{l\ge1}\frac{1}{(2l+1)L}\sum_m \langle x_{lm}^2\rangle_c`,
  and :math:`x_{l>0} \leftarrow \gamma_l \odot x_{l>0}/\sqrt{\sigma^2+\epsilon}`.
* :class:`EquivariantRMSNorm` (``"rms_norm_sh"``): centre the l=0 channels,
  one RMS over all degrees with weights :math:`1/((2l+1)(L+1))`, per-degree
  affine weight :math:`\gamma_l` and a bias on l=0 only.

Norms are computed in float32 (or higher) even under autocast.
"""
from __future__ import annotations

import torch
from torch import nn

from ..so3._layout import check_lmax, degree_index, num_coefficients, split_scalar
from ..sphere.masters import Float64Masters

__all__ = ["EquivariantLayerNorm", "EquivariantRMSNorm", "build_norm", "NORM_KINDS"]

NORM_KINDS = ("layer_norm_sh", "rms_norm_sh")


def _check_features(x: torch.Tensor, lmax: int, channels: int, name: str) -> None:
    K = num_coefficients(lmax)
    if x.dim() != 3 or x.shape[1] != K or x.shape[2] != channels:
        raise ValueError(
            f"{name}: expected features [N, {K}, {channels}] (lmax={lmax}, channels={channels}), got {tuple(x.shape)}"
        )


class _DegreeNorm(Float64Masters):
    def __init__(self, *, lmax: int, channels: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.lmax, self.channels, self.eps = check_lmax(lmax), channels, eps
        self.weight = nn.Parameter(torch.ones(lmax + 1, channels))  # [L+1, C]
        self.register_buffer("degree", degree_index(lmax), persistent=False)  # [K]

    def extra_repr(self) -> str:
        return f"lmax={self.lmax}, channels={self.channels}, eps={self.eps}"

    def _register_rms_weights(self, first_degree: int, denominator: int) -> None:
        """Buffer ``rms_weights [K]``: ``1/((2l+1) denominator)`` for ``l >= first_degree``, else 0 (built once)."""
        l = self.degree.to(torch.float64)
        w = torch.where(self.degree >= first_degree, 1.0 / ((2 * l + 1) * denominator), torch.zeros_like(l))
        self.register_master("rms_weights", w)  # float64 master: exact after any cast


class EquivariantLayerNorm(_DegreeNorm):
    """EquiformerV2's ``layer_norm_sh``; ``forward(x [N, K, C]) -> [N, K, C]``."""

    def __init__(self, *, lmax: int, channels: int, eps: float = 1e-5) -> None:
        super().__init__(lmax=lmax, channels=channels, eps=eps)
        self.bias = nn.Parameter(torch.zeros(channels))  # [C] l=0 only
        self._register_rms_weights(1, max(lmax, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_features(x, self.lmax, self.channels, type(self).__name__)
        dtype = x.dtype
        x = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        if self.lmax == 0:
            return nn.functional.layer_norm(x, (self.channels,), self.weight[0], self.bias, self.eps).to(dtype)
        x0, xr = split_scalar(x)  # [N, 1, C], [N, K-1, C]
        x0 = nn.functional.layer_norm(x0, (self.channels,), self.weight[0], self.bias, self.eps)
        w = self.rms_weights[1:].to(x.dtype)  # [K-1]
        var = (xr.pow(2).mean(-1) * w).sum(-1, keepdim=True)  # [N, 1]
        scale = self.weight[self.degree[1:]]  # [K-1, C]
        xr = xr * torch.rsqrt(var + self.eps)[..., None] * scale
        return torch.cat([x0, xr], dim=1).to(dtype)  # [N, K, C]


class EquivariantRMSNorm(_DegreeNorm):
    """EquiformerV2's ``rms_norm_sh``; ``forward(x [N, K, C]) -> [N, K, C]``."""

    def __init__(self, *, lmax: int, channels: int, eps: float = 1e-5, centering: bool = True) -> None:
        super().__init__(lmax=lmax, channels=channels, eps=eps)
        self.centering = centering
        self.bias = nn.Parameter(torch.zeros(channels))  # [C] l=0 only
        self._register_rms_weights(0, lmax + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_features(x, self.lmax, self.channels, type(self).__name__)
        dtype = x.dtype
        x = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        if self.centering:
            x0, xr = split_scalar(x)  # [N, 1, C], [N, K-1, C]
            x = torch.cat([x0 - x0.mean(-1, keepdim=True), xr], dim=1)
        w = self.rms_weights.to(x.dtype)  # [K]
        var = (x.pow(2).mean(-1) * w).sum(-1, keepdim=True)  # [N, 1]
        out = x * torch.rsqrt(var + self.eps)[..., None] * self.weight[self.degree]  # [N, K, C]
        out0, outr = split_scalar(out)
        return torch.cat([out0 + self.bias, outr], dim=1).to(dtype)


def build_norm(kind: str, *, lmax: int, channels: int, eps: float = 1e-5) -> nn.Module:
    """``"layer_norm_sh"`` or ``"rms_norm_sh"`` for features of degree ``<= lmax``."""
    if kind == "layer_norm_sh":
        return EquivariantLayerNorm(lmax=lmax, channels=channels, eps=eps)
    if kind == "rms_norm_sh":
        return EquivariantRMSNorm(lmax=lmax, channels=channels, eps=eps)
    raise ValueError(f"unknown norm {kind!r}; expected one of {NORM_KINDS}")
