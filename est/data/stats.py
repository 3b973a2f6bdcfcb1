"""Target statistics fitted on training data, kept as module buffers so they
are saved (and restored) with the model's ``state_dict``.

* :class:`Normalizer`: ``(x - mean) / std`` and back.
* :class:`LinearReference`: per-element references ``w[z]`` summed per graph,
  ``E_ref(G) = sum_{i in G} w[z_i]`` (for each target column), fitted by least
  squares ``min_w ||N w - E||^2`` with N the [graphs, elements] count matrix.
"""
from __future__ import annotations

import warnings
from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch import nn

__all__ = ["Normalizer", "LinearReference", "fit_normalizer", "fit_linear_reference", "collect_targets",
           "dataset_statistics"]


class _ResizingBuffers(nn.Module):
    """Buffers take the shape of the state being loaded (a fresh module restores any fit)."""

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for name, buf in list(self._buffers.items()):
            key = prefix + name
            if key in state_dict and buf is not None and state_dict[key].shape != buf.shape:
                self._buffers[name] = torch.empty_like(state_dict[key], dtype=buf.dtype, device=buf.device)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class Normalizer(_ResizingBuffers):
    """``norm(x) = (x - mean) / std``, ``denorm(y) = y * std + mean`` (buffers: saved with the model)."""

    def __init__(self, mean: Any = 0.0, std: Any = 1.0):
        super().__init__()
        self.register_buffer("mean", torch.as_tensor(mean, dtype=torch.float64).clone())
        self.register_buffer("std", torch.as_tensor(std, dtype=torch.float64).clone())

    def norm(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean.to(x.dtype)) / self.std.to(x.dtype)

    def denorm(self, y: torch.Tensor) -> torch.Tensor:
        return y * self.std.to(y.dtype) + self.mean.to(y.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)

    def extra_repr(self) -> str:
        return f"mean={self.mean.tolist()}, std={self.std.tolist()}"


class LinearReference(_ResizingBuffers):
    """Per-element linear reference: ``ref(batch)[g] = sum_{i in g} weight[z_i]`` -> [B] or [B, T]."""

    def __init__(self, weight: Optional[torch.Tensor] = None, *, max_z: int = 100, num_targets: int = 1):
        super().__init__()
        if weight is None:
            weight = torch.zeros(max_z + 1, num_targets, dtype=torch.float64)
        weight = torch.as_tensor(weight, dtype=torch.float64)
        if weight.dim() == 1:
            weight = weight[:, None]
        self.register_buffer("weight", weight.clone())  # [Zmax + 1, T]

    def forward(self, atomic_numbers: torch.Tensor, batch: Optional[torch.Tensor] = None,
                num_graphs: Optional[int] = None) -> torch.Tensor:
        per_atom = self.weight[atomic_numbers]  # [N, T]
        if batch is None:
            batch = torch.zeros_like(atomic_numbers)
        B = int(num_graphs) if num_graphs is not None else (int(batch.max()) + 1 if batch.numel() else 0)
        out = torch.zeros(B, per_atom.shape[1], dtype=per_atom.dtype, device=per_atom.device)
        out.index_add_(0, batch, per_atom)  # [B, T]
        return out[:, 0] if out.shape[1] == 1 else out


def collect_targets(dataset: Any, key: str = "energy", indices: Optional[Sequence[int]] = None,
                    column: Optional[int] = None):
    """(targets [M] or [M, T] float64, list of atomic-number tensors) from a dataset."""
    indices = range(len(dataset)) if indices is None else indices
    ys, zs = [], []
    for i in indices:
        s = dataset[int(i)]
        v = getattr(s, key).to(torch.float64).reshape(-1)
        ys.append(v if column is None else v[column : column + 1])
        zs.append(s.atomic_numbers)
    y = torch.stack(ys)  # [M, T]
    return (y[:, 0] if y.shape[1] == 1 else y), zs


def _finite_rows(y: torch.Tensor, what: str) -> torch.Tensor:
    """Mask [M] of rows of ``y`` ([M] or [M, T]) without NaN/inf; warns about the others, raises if none is left."""
    ok = torch.isfinite(y.reshape(y.shape[0], -1)).all(dim=1) if y.numel() else torch.ones(y.shape[0], dtype=torch.bool)
    if not bool(ok.any()):
        raise ValueError(f"{what}: no finite targets to fit (got {y.shape[0]} rows). Fix: check the data's targets")
    bad = int((~ok).sum())
    if bad:
        first = (~ok).nonzero()[:5, 0].tolist()
        warnings.warn(f"{what}: {bad} of {y.shape[0]} targets are NaN/inf (rows {first}...); they are left out of the fit")
    return ok


def fit_normalizer(values: Any) -> Normalizer:
    """Normalizer with the mean and (population) std of ``values`` ([M] or [M, T]); NaN/inf rows are left out."""
    v = torch.as_tensor(values, dtype=torch.float64)
    v = v[_finite_rows(v, "fit_normalizer")]
    std = v.std(dim=0, unbiased=False)
    return Normalizer(v.mean(dim=0), torch.where(std > 0, std, torch.ones_like(std)))


def fit_linear_reference(targets: Any, atomic_numbers: Sequence[torch.Tensor], *, max_z: int = 100,
                         unseen: float = 0.0) -> LinearReference:
    """Least-squares per-element references (no intercept); NaN/inf rows are left out.

    Elements absent from the fitted rows get ``unseen`` (0 by default; ``float("nan")`` makes any later use
    of an element the fit never saw visible instead of silently adding nothing).
    """
    y = torch.as_tensor(targets, dtype=torch.float64)
    Y = y[:, None] if y.dim() == 1 else y  # [M, T]
    ok = _finite_rows(Y, "fit_linear_reference")
    Y = Y[ok]
    atomic_numbers = [z for z, keep in zip(atomic_numbers, ok.tolist()) if keep]
    counts = np.zeros((len(atomic_numbers), max_z + 1))
    for g, z in enumerate(atomic_numbers):
        np.add.at(counts[g], np.asarray(z, dtype=np.int64), 1.0)
    present = counts.sum(0) > 0
    w, *_ = np.linalg.lstsq(counts[:, present], Y.numpy(), rcond=None)
    weight = np.full((max_z + 1, Y.shape[1]), float(unseen))
    weight[present] = w
    return LinearReference(torch.from_numpy(weight))


def dataset_statistics(dataset: Any, *, cutoff: Optional[float] = None, max_neighbors: Optional[int] = None,
                       max_samples: int = 2000, seed: int = 0) -> dict:
    """Statistics models need, from up to ``max_samples`` random samples.

    Returns ``avg_num_nodes`` (mean atoms per graph), ``max_num_nodes``,
    ``avg_degree`` (mean incoming edges per atom of the radius graph with
    ``cutoff``/``max_neighbors``, PBC from each sample; only when ``cutoff``
    is given), and, when present, ``energy_mean``/``energy_std`` and
    ``forces_rms`` (the RMS force component, EquiformerV2's force scale).
    """
    n = len(dataset)
    rng = np.random.default_rng(seed)
    idx = rng.permutation(n)[: min(n, max_samples)]
    natoms, degrees, energies, f2, fcount = [], [], [], 0.0, 0
    graph_fn = None
    if cutoff is not None:
        from ..geometry import radius_graph as graph_fn
    for i in idx:
        s = dataset[int(i)]
        k = int(s.pos.shape[0])
        natoms.append(k)
        if graph_fn is not None:
            cell = getattr(s, "cell", None)
            pbc = getattr(s, "pbc", None)
            g = graph_fn(s.pos.to(torch.float64), float(cutoff), cell=None if cell is None else cell.to(torch.float64),
                         pbc=pbc, max_neighbors=max_neighbors)
            degrees.append(g.edge_index.shape[1] / max(k, 1))
        e = getattr(s, "energy", None)
        if e is not None:
            energies.append(float(e.reshape(-1)[0]))
        f = getattr(s, "forces", None)
        if f is not None:
            f2 += float((f.to(torch.float64) ** 2).sum())
            fcount += f.numel()
    out = {"samples": len(idx), "avg_num_nodes": float(np.mean(natoms)), "max_num_nodes": int(np.max(natoms))}
    if degrees:
        w = np.asarray(natoms, dtype=np.float64)
        out["avg_degree"] = float(np.sum(np.asarray(degrees) * w) / w.sum())  # edges / atoms over all graphs
    if energies:
        out["energy_mean"] = float(np.mean(energies))
        out["energy_std"] = float(np.std(energies))
    if fcount:
        out["forces_rms"] = float(np.sqrt(f2 / fcount))
    return out
