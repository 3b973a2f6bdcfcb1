"""Regularisers that respect graphs and equivariance."""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["GraphDropPath", "EquivariantDropout"]


class GraphDropPath(nn.Module):
    r"""Stochastic depth per graph: drop a whole residual branch for a graph.

    ``forward(x [N, ...], batch [N] | None)``: in training, each graph keeps
    its branch with probability :math:`1-p` and kept branches are scaled by
    :math:`1/(1-p)`; identity in eval. ``batch=None`` treats all nodes as one graph.
    """

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"drop path probability must be in [0, 1), got {p}")
        self.p = p

    def extra_repr(self) -> str:
        return f"p={self.p}"

    def forward(self, x: torch.Tensor, batch: torch.Tensor | None = None) -> torch.Tensor:
        if not self.training or self.p == 0.0 or x.shape[0] == 0:
            return x
        num_graphs = 1 if batch is None else int(batch.max()) + 1
        keep = (torch.rand(num_graphs, device=x.device) >= self.p).to(x.dtype) / (1 - self.p)  # [B]
        mask = keep[0].expand(x.shape[0]) if batch is None else keep[batch]  # [N]
        return x * mask.view(-1, *([1] * (x.dim() - 1)))


class EquivariantDropout(nn.Module):
    """Dropout of whole channels (same mask for every coefficient of a channel)."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [N, K, C]
        if not self.training or self.p == 0.0:
            return x
        mask = torch.bernoulli(torch.full((x.shape[0], 1, x.shape[-1]), 1 - self.p, device=x.device, dtype=x.dtype))
        return x * mask / (1 - self.p)
