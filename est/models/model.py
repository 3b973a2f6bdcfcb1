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

from ..geometry import apply_strain
from .backbone import EquiformerV2Backbone
from .config import ModelConfig, check_renamed
from .heads import DirectForceHead, ScalarHead
from .init import init_weights_

__all__ = ["EquiformerV2"]


def _get(data, name):
    return getattr(data, name, None) if name in data else None


def _atomic_numbers(data, num_atoms: int) -> torch.Tensor:
    """``data.atomic_numbers`` as long ``[N]``; integral floats (OC20 LMDBs store Z as float) are accepted."""
    z = _get(data, "atomic_numbers")
    if z is None:
        hint = " (it has 'z': set data.atomic_numbers = data.z)" if _get(data, "z") is not None else ""
        raise ValueError(
            f"the batch has no atomic_numbers{hint}; every sample needs atomic_numbers, a long tensor [N] of "
            "Z per atom (docs/CONVENTIONS.md)"
        )
    if not isinstance(z, torch.Tensor) or z.dim() != 1 or z.shape[0] != num_atoms:
        shape = tuple(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__
        raise ValueError(f"batch.atomic_numbers must be a 1-D tensor [N={num_atoms}] (one Z per atom), got {shape}")
    if z.dtype == torch.bool or z.is_complex():
        raise TypeError(f"batch.atomic_numbers must be integers (torch.long), got {z.dtype}")
    if z.is_floating_point():
        frac = (z != torch.round(z)) | ~torch.isfinite(z)
        if bool(frac.any()):
            i = int(frac.nonzero()[0])
            raise ValueError(
                f"batch.atomic_numbers holds the non-integer value {float(z[i]):g} at atom {i}; atomic numbers are "
                "whole numbers: pass a long tensor (integral floats such as 6.0 are accepted and converted)"
            )
    return z.long()


def _periodicity(data, cfg: ModelConfig, dtype) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(cell [B, 3, 3] | None, pbc bool [B, 3] | None)``; ``ValueError`` for pbc without a cell."""
    cell, pbc = _get(data, "cell"), _get(data, "pbc")
    if pbc is not None:
        pbc = torch.as_tensor(pbc).view(-1, 3).bool()
    if cell is not None:
        cell = cell.view(-1, 3, 3).to(dtype)
    if cfg.use_pbc and pbc is not None and bool(pbc.any()):
        if cell is None:
            raise ValueError(
                "batch.pbc is True but the batch has no cell: a periodic structure needs its lattice vectors "
                "(batch.cell [B, 3, 3], rows); for a molecule set pbc to all False (or use_pbc=False in the model)"
            )
        zero_rows = pbc.to(cell.device) & (cell.detach().abs().sum(-1) == 0)  # [B, 3] periodic but zero vector
        if bool(zero_rows.any()):
            g, d = (int(v) for v in zero_rows.nonzero()[0])
            raise ValueError(
                f"graph {g} is periodic along lattice vector {d} (pbc={pbc[g].tolist()}) but that cell row is zero; "
                "give the lattice vectors in batch.cell, or set pbc to False along directions without one"
            )
    return cell, pbc


def _check_dtype(pos: torch.Tensor, model: nn.Module) -> None:
    w = next(model.parameters())
    if pos.dtype != w.dtype:
        fix = {torch.float64: "model.double()", torch.float32: "model.float()"}.get(pos.dtype, f"model.to({pos.dtype})")
        raise TypeError(
            f"batch.pos is {pos.dtype} but the model's weights are {w.dtype}; cast the model ({fix}) or the "
            f"inputs (batch.pos and batch.cell .to({w.dtype})); for bfloat16 use torch.autocast, not bfloat16 positions"
        )


class EquiformerV2(nn.Module):
    """EquiformerV2 with a replaceable update block (``config.update``)."""

    def __init__(self, config: ModelConfig | None = None, **kwargs) -> None:
        super().__init__()
        check_renamed(kwargs)
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
        init_weights_(self, cfg.weight_init)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, data) -> dict[str, torch.Tensor]:
        cfg = self.config
        pos = data.pos
        if pos is None or pos.dim() != 2 or pos.shape[-1] != 3:
            raise ValueError(f"batch.pos must be [N, 3], got {None if pos is None else tuple(pos.shape)}")
        if pos.shape[0] == 0:
            raise ValueError("empty batch: no atoms")
        _check_dtype(pos, self)
        z = _atomic_numbers(data, pos.shape[0])
        batch = _get(data, "batch")
        batch = torch.zeros_like(z) if batch is None else batch
        num_graphs = int(batch.max()) + 1
        cell, pbc = _periodicity(data, cfg, pos.dtype)

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
                # allow_unused: a graph without edges has an energy that does not depend on the
                # positions; its forces (and stress) are then exactly zero
                grads = torch.autograd.grad(
                    out["energy"].sum(), inputs, create_graph=self.training, allow_unused=True, materialize_grads=True
                )
                out["forces"] = -grads[0]  # [N, 3]
                if displacement is not None:
                    vol = torch.linalg.det(cell).abs()  # [B]; 0 for molecules -> stress 0
                    safe = torch.where(vol > 1e-12, vol, torch.ones_like(vol))
                    out["stress"] = torch.where(vol[:, None, None] > 1e-12, grads[1] / safe[:, None, None], 0.0)
        return out
