r"""EquiformerV2's feed-forward network on irreps features (the steerable expert).

.. math::
    \hat x = \mathrm{Norm}(x),\quad h = W^{(1)}_l \hat x_l,\quad
    h' = \mathcal{F}^{-1}\big[\mathrm{MLP}(\mathcal{F} h)\big],\quad
    h'_0 = \mathrm{SiLU}(W_0 \hat x_0),\quad y = W^{(2)}_l h'_l

with :math:`\mathcal{F}` the spherical Fourier transform (values at points, degree l
scaled by :math:`n_l = 1/\sqrt{(2l+1)(L+1)}`: EquiformerV2's "component" grids, so
the MLP sees the amplitudes it sees in fairchem; ``grid_scaling``),
the MLP pointwise over points (Linear-SiLU-Linear-SiLU-Linear, no bias), and
per-degree linears :math:`W^{(1)}, W^{(2)}`. The l = 0 output of the grid is
replaced by a separate scalar MLP, as in EquiformerV2's grid-MLP FFN.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from .grid import GridConfig, check_features, check_positive
from .linear import DegreeLinear
from .norms import build_norm

__all__ = ["SteerableFFN", "SteerableFFNConfig"]


@dataclass(kw_only=True)
class SteerableFFNConfig:
    lmax: int
    channels: int
    hidden_channels: int = 128
    out_channels: int | None = None  # default: channels (1 for an energy head)
    norm: str | None = "rms_norm_sh"  # own pre-norm; None to skip
    grid: GridConfig = field(default_factory=lambda: GridConfig(kind="equiangular"))
    grid_scaling: str = "component"  # amplitude on the grid (est.sphere.degree_scale); EquiformerV2: component

    def __post_init__(self) -> None:
        check_positive(self, ("channels", "hidden_channels", "out_channels"), owner="SteerableFFNConfig")


class SteerableFFN(nn.Module):
    """``forward(x [N, K, C]) -> [N, K, C_out]`` (the update, without the residual)."""

    def __init__(self, config: SteerableFFNConfig | None = None, **kwargs) -> None:
        super().__init__()
        cfg = config if config is not None else SteerableFFNConfig(**kwargs)
        self.config = cfg
        L, C, H = cfg.lmax, cfg.channels, cfg.hidden_channels
        self.norm = build_norm(cfg.norm, lmax=L, channels=C) if cfg.norm else nn.Identity()
        self.linear_in = DegreeLinear(lmax=L, in_channels=C, out_channels=H)
        self.scalar = nn.Sequential(nn.Linear(C, H), nn.SiLU())
        self.sft = cfg.grid.build(L, degree_scaling=cfg.grid_scaling)
        self.grid_mlp = nn.Sequential(
            nn.Linear(H, H, bias=False), nn.SiLU(), nn.Linear(H, H, bias=False), nn.SiLU(), nn.Linear(H, H, bias=False)
        )
        self.linear_out = DegreeLinear(lmax=L, in_channels=H, out_channels=cfg.out_channels or C)
        self.check_inputs = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        if self.check_inputs:
            check_features(x, lmax=cfg.lmax, channels=cfg.channels, name="SteerableFFN", module=self)
        xn = self.norm(x)  # [N, K, C]
        h = self.linear_in(xn)  # [N, K, H]
        f = self.grid_mlp(self.sft.to_sphere(h))  # [N, S, H]
        h = self.sft.from_sphere(f)  # [N, K, H]
        h = torch.cat([self.scalar(xn[:, 0])[:, None], h[:, 1:]], dim=1)  # [N, K, H]
        return self.linear_out(h)  # [N, K, C_out]
