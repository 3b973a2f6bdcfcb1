r"""The full model: backbone + heads, ``model(batch) -> dict``.

Input: a ``torch_geometric`` ``Batch`` (or ``Data``) with ``pos [N, 3]``,
``atomic_numbers [N]``, and for periodic systems ``cell [B, 3, 3]`` and
``pbc [B, 3]`` (see docs/CONVENTIONS.md). Output keys: ``"energy" [B]``,
``"forces" [N, 3]``, ``"stress" [B, 3, 3]``, ``"properties" [B, T]``, all in the
normalised space the trainer fits.

Gradient forces: :math:`F = -\partial E/\partial x`, with the graph built from
positions that require grad (the edge frames keep their gradients). Stress:
positions and cells are strained by a symmetric :math:`\epsilon` that
requires grad, :math:`\sigma = \frac1V\partial E/\partial\epsilon`.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from ..data.graph import apply_strain
from .backbone import EquiformerV2Backbone
from .config import ModelConfig
from .heads import DirectForceHead, ScalarHead

__all__ = ["EquiformerV2"]


def _get(data, name):
    return getattr(data, name, None) if name in data else None


class EquiformerV2(nn.Module):
    """EquiformerV2 with a replaceable update block (``config.update``)."""

    def __init__(self, config: ModelConfig | None = None, **kwargs) -> None:
        super().__init__()
        if config is None:
            config = ModelConfig(**kwargs)
        elif kwargs:
            config = config.replace(**kwargs)
        self.config = cfg = config
        self.backbone = EquiformerV2Backbone(cfg)
        self.energy_head = ScalarHead(cfg, num_outputs=1, reduce=cfg.energy_reduce) if cfg.regress_energy else None
        self.force_head = DirectForceHead(cfg) if cfg.regress_forces == "direct" else None
        self.property_head = (
            ScalarHead(cfg, num_outputs=cfg.num_targets, reduce=cfg.property_reduce) if cfg.num_targets else None
        )
        if cfg.regress_forces == "gradient" and not cfg.regress_energy:
            raise ValueError("gradient forces need regress_energy=True")

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, data) -> dict[str, torch.Tensor]:
        cfg = self.config
        pos = data.pos
        if pos is None or pos.dim() != 2 or pos.shape[-1] != 3:
            raise ValueError(f"batch.pos must be [N, 3], got {None if pos is None else tuple(pos.shape)}")
        if pos.shape[0] == 0:
            raise ValueError("empty batch: no atoms")
        z = data.atomic_numbers.long()
        batch = _get(data, "batch")
        batch = torch.zeros_like(z) if batch is None else batch
        num_graphs = int(batch.max()) + 1
        cell, pbc = _get(data, "cell"), _get(data, "pbc")
        if cell is not None:
            cell = cell.view(-1, 3, 3).to(pos.dtype)
        if pbc is not None:
            pbc = pbc.view(-1, 3).bool()

        grad_forces = cfg.regress_forces == "gradient"
        displacement = None
        with torch.enable_grad() if grad_forces else contextlib.nullcontext():
            if grad_forces and not pos.requires_grad:
                pos = pos.detach().requires_grad_(True)
            pos_in, cell_in = pos, cell
            if cfg.regress_stress and cell is not None and pbc is not None and bool(pbc.any()):
                pos_in, cell_in, displacement = apply_strain(pos, cell, batch)
            x, frame = self.backbone(pos_in, z, batch, cell_in, pbc)
            out: dict[str, torch.Tensor] = {}
            if self.energy_head is not None:
                out["energy"] = self.energy_head(x, batch, num_graphs)[:, 0]  # [B]
            if self.property_head is not None:
                out["properties"] = self.property_head(x, batch, num_graphs)  # [B, T]
            if self.force_head is not None:
                out["forces"] = self.force_head(x, frame)  # [N, 3]
            if grad_forces:
                inputs = [pos] + ([displacement] if displacement is not None else [])
                grads = torch.autograd.grad(out["energy"].sum(), inputs, create_graph=self.training)
                out["forces"] = -grads[0]  # [N, 3]
                if displacement is not None:
                    vol = torch.linalg.det(cell).abs()  # [B]; 0 for molecules -> stress 0
                    safe = torch.where(vol > 1e-12, vol, torch.ones_like(vol))
                    out["stress"] = torch.where(vol[:, None, None] > 1e-12, grads[1] / safe[:, None, None], 0.0)
        return out
