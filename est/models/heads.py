r"""Output heads on the backbone's node features ``x [N, K, C]``.

* :class:`ScalarHead`: EquiformerV2's energy block, an FFN to ``T`` channels
  whose l = 0 part is a per-atom scalar; summed per graph and divided by
  ``avg_num_nodes`` (EquiformerV2's convention, ``reduce="sum"``) or averaged.
  Used for the energy (T = 1) and for QM9 properties.
* :class:`DirectForceHead`: EquiformerV2's force block, an SO(2) attention
  layer with one output channel whose l = 1 coefficients are the force
  (e3nn's l = 1 basis is (x, y, z)). Equivariant, but not a gradient.
* gradient forces and stress live in :mod:`est.models.model`
  (``F = -dE/dx``, ``sigma = (1/V) dE/d eps``).
"""
from __future__ import annotations

import torch
from torch import nn

from ..nn import GridConfig, SteerableFFN, SteerableFFNConfig
from ..nn.attention import SO2GraphAttention
from ..nn.edges import EdgeFrame
from .config import ModelConfig

__all__ = ["ScalarHead", "DirectForceHead", "scatter_graphs"]


def scatter_graphs(values: torch.Tensor, batch: torch.Tensor, num_graphs: int, reduce: str) -> torch.Tensor:
    """Sum or mean of per-atom ``values [N, ...]`` per graph: ``[B, ...]``."""
    out = values.new_zeros((num_graphs, *values.shape[1:])).index_add_(0, batch, values)
    if reduce == "mean":
        counts = torch.bincount(batch, minlength=num_graphs).clamp_min(1).to(values.dtype)
        out = out / counts.view(-1, *([1] * (values.dim() - 1)))
    return out


class ScalarHead(nn.Module):
    """``forward(x [N, K, C], batch [N], num_graphs) -> [B, T]``."""

    def __init__(self, cfg: ModelConfig, *, num_outputs: int, reduce: str) -> None:
        super().__init__()
        self.ffn = SteerableFFN(
            SteerableFFNConfig(
                lmax=cfg.lmax,
                channels=cfg.channels,
                hidden_channels=cfg.ffn_hidden_channels,
                out_channels=num_outputs,
                norm=None,
                grid=GridConfig(kind="equiangular", resolution=cfg.grid_resolution),
            )
        )
        self.ffn.check_inputs = False
        self.reduce = reduce
        self.scale = 1.0 / cfg.avg_num_nodes if reduce == "sum" else 1.0

    def forward(self, x: torch.Tensor, batch: torch.Tensor, num_graphs: int) -> torch.Tensor:
        per_atom = self.ffn(x)[:, 0]  # [N, T] (l = 0)
        return scatter_graphs(per_atom, batch, num_graphs, self.reduce) * self.scale  # [B, T]


class DirectForceHead(nn.Module):
    """``forward(x [N, K, C], frame) -> forces [N, 3]``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        from .backbone import attention_config

        if cfg.lmax < 1:
            raise ValueError("direct forces need lmax >= 1 (they are the l = 1 output)")
        self.attention = SO2GraphAttention(attention_config(cfg, output_channels=1))

    def forward(self, x: torch.Tensor, frame: EdgeFrame) -> torch.Tensor:
        return self.attention(x, frame)[:, 1:4, 0]  # [N, 3]
