"""Tasks: target normalisation, loss and metrics for QM9, OC20 S2EF and IS2RE.

Models predict in normalised target space; a task owns the normalisers.

* S2EF: ``e = (E - R(G) - mu_E) / sigma_E``, ``f = F / sigma_E`` (forces share
  the energy std, mean 0), with ``R(G) = sum_{i in G} w[z_i]`` per-element
  references. ``atomref=fit`` (the default) fits ``w`` by least squares
  ``min_w sum_G (E_G - R(G))^2`` on the training set (at most
  ``trainer.normalizer.max_samples`` random structures), then ``mu_E`` and
  ``sigma_E`` on ``E - R``; ``atomref=none``: ``w = 0``. ``w`` is saved with the
  normalisers (``atomref``, [119] eV, NaN for elements the fit never saw: one
  in a training batch raises; in evaluation it counts 0 eV with a warning
  naming it, never silently); predictions add ``R`` back, so they are total
  energies in the data's units. Loss (reference.md)::

      L = lambda_E * sum_b |e_b - e*_b| / G  +  lambda_F * sum_{i free} ||f_i - f*_i||_2 / A_free

  with G graphs and A_free free atoms (``fixed == 0``) of the *global* batch.
* IS2RE: the energy term only (same references).
* QM9: ``L = sum_{b,t} |p_bt - p*_bt| / (G T)`` on normalised targets
  ``(y_t - ref_t - mu_t) / sigma_t``. U0/U/H/G (7-10) are learned minus atom
  reference energies: with ``atomref=b3lyp`` the target column is PyG's
  atomisation column t+5 (``y_t - sum_i ref(z_i)`` computed in float64 by the
  data source, so no float32 cancellation at 11,000 eV); with ``atomref=fit``
  the least-squares references replace QM9's (``y_{t+5} - sum_i (fit - b3lyp)(z_i)``).
  Per-molecule offsets do not change errors, so reported MAEs are MAEs of ``y_t``.

Under DDP every rank computes ``loss_local * world / global_count``; DDP's
gradient averaging then gives exactly the loss of the global batch.

Metrics are sums of totals and counts (:meth:`Task.accumulate`), all-reduced,
then divided (:meth:`Task.finalize`), so they do not depend on how samples are
split across ranks or batches. Every model metric ``m`` has a baseline
``base_m``: the mean predictor (normalised prediction 0, i.e. the training
mean; zero forces), printed next to it.
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from .config import QM9_TARGETS

__all__ = ["Task", "QM9Task", "S2EFTask", "IS2RETask", "build_task", "QM9_ENERGY_TARGETS", "QM9_UNITS"]

#: QM9 targets in eV (reported in meV)
QM9_ENERGY_TARGETS = frozenset({2, 3, 4, 6, 7, 8, 9, 10, 12, 13, 14, 15})
QM9_UNITS = {0: "D", 1: "a0^3", 5: "a0^2", 11: "cal/mol/K", 16: "GHz", 17: "GHz", 18: "GHz"}
for _t in QM9_ENERGY_TARGETS:
    QM9_UNITS[_t] = "meV"

EFWT_ENERGY = 0.02  # eV
EFWT_FORCE = 0.03  # eV/A


def _graph_sum(values: Tensor, batch: Tensor, num_graphs: int) -> Tensor:
    out = torch.zeros((num_graphs,) + values.shape[1:], dtype=values.dtype, device=values.device)
    return out.index_add_(0, batch, values)


def _sample_iter(dataset, max_samples: int, seed: int):
    n = len(dataset)
    if n > max_samples:
        idx = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:max_samples].tolist()
    else:
        idx = range(n)
    for i in idx:
        yield dataset[int(i)]


class Task:
    name = "task"
    primary_metric = "loss"
    units: Dict[str, str] = {}

    def __init__(self, *, energy_coefficient: float = 1.0, force_coefficient: float = 0.0,
                 normalizers: Optional[Dict[str, Tensor]] = None):
        self.cE = float(energy_coefficient)
        self.cF = float(force_coefficient)
        self.norm = normalizers or {}

    # -- normalisers
    def fit_normalizers(self, train_dataset, ncfg) -> Dict[str, Tensor]:
        raise NotImplementedError

    def state_dict(self) -> Dict[str, Tensor]:
        return {k: v.detach().cpu() for k, v in self.norm.items()}

    def load_state_dict(self, state: Dict[str, Tensor]) -> None:
        self.norm = {k: v.clone() for k, v in state.items()}

    def to(self, device) -> "Task":
        self.norm = {k: v.to(device) for k, v in self.norm.items()}
        return self

    # -- loss
    def local_counts(self, batch) -> Tensor:
        """Counts whose global sums scale the loss (float64 [k])."""
        raise NotImplementedError

    def loss(self, out: Dict[str, Tensor], batch, global_counts: Tensor, world_size: int) -> Tensor:
        raise NotImplementedError

    # -- metrics
    def metric_names(self) -> List[str]:
        raise NotImplementedError

    def accumulate(self, sums: Dict[str, Tensor], out: Dict[str, Tensor], batch) -> None:
        raise NotImplementedError

    def finalize(self, sums: Dict[str, float]) -> Dict[str, float]:
        raise NotImplementedError

    def predictions(self, out: Dict[str, Tensor], batch) -> Dict[str, np.ndarray]:
        raise NotImplementedError

    def check_output(self, out: Dict[str, Tensor], batch) -> None:
        pass

    @staticmethod
    def _add(sums: Dict[str, Tensor], key: str, value: Tensor) -> None:
        v = value.detach().to(torch.float64).sum()
        sums[key] = sums[key] + v if key in sums else v


# ============================================================================ S2EF / IS2RE
#: size of the fitted per-element reference table (Z = 0..118)
ATOMREF_SIZE = 119


def fit_energy_reference(energies: Tensor, atomic_numbers: Sequence[Tensor], *, expected: Optional[Sequence[int]] = None,
                         where: str = "the training structures") -> Tensor:
    """Least-squares per-element energies ``w`` [ATOMREF_SIZE] (float64, eV) with ``E_g ~ sum_{i in g} w[z_i]``.

    Elements absent from the fitted structures are NaN, so a structure with one of them cannot silently get a
    zero reference (:meth:`_EnergyTask.reference` raises). ``expected``: elements the data says it holds
    (dataset metadata); one missing from the fitted structures is an error here, at fit time.
    """
    from est.data.stats import fit_linear_reference

    w = fit_linear_reference(energies, atomic_numbers, max_z=ATOMREF_SIZE - 1, unseen=float("nan")).weight[:, 0]
    missing = sorted(int(z) for z in (expected or ()) if not (0 <= int(z) < ATOMREF_SIZE and torch.isfinite(w[int(z)])))
    if missing:
        raise ValueError(f"data.atomref=fit: elements {missing} are listed in the dataset's metadata but absent from "
                         f"{where}, which the references were fitted on. Fix: raise "
                         "trainer.normalizer.max_samples (up to the training-set size) or set data.atomref=none.")
    return w


class _EnergyTask(Task):
    """Energy targets ``e = (E - sum_i ref(z_i) - mu) / sigma``; ``ref`` = 0 unless ``atomref="fit"`` (then it is
    fitted on the training set by least squares and kept in the normalisers as ``atomref``)."""

    def __init__(self, *, atomref: str = "none", **kw):
        super().__init__(**kw)
        if atomref not in ("fit", "none"):
            raise ValueError(f"atomref={atomref!r} for data.task={self.name}: choose 'fit' or 'none' "
                             "('b3lyp' is QM9's table of free-atom energies)")
        self.atomref = atomref
        self._unreferenced: set = set()  # elements already warned about in evaluation

    def fit_normalizers(self, train_dataset, ncfg) -> Dict[str, Tensor]:
        mean, std = ncfg.energy_mean, ncfg.energy_std
        fit_ref = self.atomref == "fit"
        if fit_ref and (mean is not None or std is not None):
            raise ValueError("data.atomref=fit with fixed trainer.normalizer.energy_mean/energy_std: the fixed values "
                             "would apply to energies minus fitted references. Fix: data.atomref=none to keep them, "
                             "or set both to null to fit them after the references.")
        if (mean is None or std is None) and not ncfg.fit:
            raise ValueError("trainer.normalizer.fit=false needs trainer.normalizer.energy_mean and energy_std "
                             "(and data.atomref=none). Fix: set them, or trainer.normalizer.fit=true.")
        ref = None
        if mean is None or std is None:
            e, zs = [], []
            for s in _sample_iter(train_dataset, ncfg.max_samples, 0):
                e.append(float(s.energy.reshape(-1)[0]))
                zs.append(s.atomic_numbers)
            e = torch.tensor(e, dtype=torch.float64)  # [M]
            ok = torch.isfinite(e)
            bad = int((~ok).sum())
            if bad:
                warnings.warn(f"{bad} of {e.numel()} training energies are not finite; the normaliser ignores them")
                e, zs = e[ok], [z for z, keep in zip(zs, ok.tolist()) if keep]
            if e.numel() == 0:
                raise ValueError("the training set is empty: cannot fit the energy normaliser")
            if fit_ref:
                meta = getattr(train_dataset, "elements", None)
                n = len(train_dataset)
                where = f"all {n} training structures" if n <= ncfg.max_samples else \
                    f"{ncfg.max_samples} random training structures (of {n})"
                ref = fit_energy_reference(e, zs, expected=None if meta is None or callable(meta) else meta, where=where)
                e = e - torch.stack([ref[z].sum() for z in zs])
            mean = float(e.mean()) if mean is None else mean
            fitted_std = float(e.std()) if e.numel() > 1 else 1.0
            std = (fitted_std if fitted_std > 1e-8 else 1.0) if std is None else std
        self.norm = {"energy_mean": torch.tensor(float(mean), dtype=torch.float64),
                     "energy_std": torch.tensor(float(std), dtype=torch.float64)}
        if ref is not None:
            self.norm["atomref"] = ref
        return self.norm

    def reference(self, batch, *, strict: bool = True) -> Tensor:
        """``sum_{i in g} ref(z_i)`` [B] (float64, eV): zeros without fitted references (``norm["atomref"]``).

        An element without a fitted reference (absent from the structures of the fit) raises with ``strict``
        (training: the target would be off by its whole atomic energy); otherwise (evaluation) it counts 0 eV
        per atom, with one warning per element: its structures' energy errors include that atomic energy.
        """
        ref = self.norm.get("atomref")
        if ref is None:
            return torch.zeros(batch.num_graphs, dtype=torch.float64, device=batch.pos.device)
        z = batch.atomic_numbers
        per_atom = ref[z.clamp(0, ref.numel() - 1)]  # [N]
        bad = torch.isnan(per_atom) | (z >= ref.numel())
        if bool(bad.any()):
            unseen = sorted(set(z[bad].tolist()))
            if strict:
                raise ValueError(f"elements {unseen} have no fitted energy reference: they were absent from the training "
                                 "structures the references were fitted on. Fix: raise trainer.normalizer.max_samples "
                                 "(up to the training-set size) so the fit sees them, or data.atomref=none.")
            new = [u for u in unseen if u not in self._unreferenced]
            if new:
                self._unreferenced.update(new)
                warnings.warn(f"evaluated structures hold elements {new} that the training structures (and the fitted "
                              "references) lack: they count 0 eV per atom, so these structures' energy errors include "
                              "their whole atomic energies (the model never saw them either)")
            per_atom = torch.where(bad, torch.zeros_like(per_atom), per_atom)
        return _graph_sum(per_atom, batch.batch, batch.num_graphs)

    def _energy(self, out: Dict[str, Tensor], batch, *, strict: bool = True) -> Tuple[Tensor, Tensor]:
        """(normalised prediction [B], normalised target [B]) in float32 (``strict``: see :meth:`reference`)."""
        mu, sd = self.norm["energy_mean"], self.norm["energy_std"]
        pred = out["energy"].float().reshape(-1)
        target = ((batch.energy.reshape(-1).double() - self.reference(batch, strict=strict) - mu) / sd).float()
        return pred, target

    def _total_energy(self, out: Dict[str, Tensor], batch) -> np.ndarray:
        """Predicted energies [B] in eV, references included (the data's energies)."""
        sd, mu = self.norm["energy_std"], self.norm["energy_mean"]
        return (out["energy"].double().reshape(-1) * sd + mu + self.reference(batch, strict=False)).cpu().numpy()

    def check_output(self, out, batch) -> None:
        if "energy" not in out:
            raise KeyError(f"the model returned {sorted(out)} but data.task={self.name} needs 'energy' [B]. "
                           "Fix: use a model with an energy head.")
        if out["energy"].reshape(-1).shape[0] != batch.num_graphs:
            raise ValueError(f"model 'energy' has shape {tuple(out['energy'].shape)}, expected [{batch.num_graphs}]")


class S2EFTask(_EnergyTask):
    name = "s2ef"
    primary_metric = "forces_mae"
    units = {"energy_mae": "eV", "forces_mae": "eV/A", "forces_cos": "", "efwt": "", "loss": ""}

    def local_counts(self, batch) -> Tensor:
        free = (batch.fixed == 0).sum() if hasattr(batch, "fixed") else torch.tensor(batch.num_nodes)
        return torch.tensor([float(batch.num_graphs), float(free)], dtype=torch.float64)

    def _free(self, batch) -> Tensor:
        return batch.fixed == 0 if hasattr(batch, "fixed") else torch.ones(batch.num_nodes, dtype=torch.bool, device=batch.pos.device)

    def loss(self, out, batch, global_counts, world_size):
        pred, target = self._energy(out, batch)
        G, A = float(global_counts[0]), float(global_counts[1])
        loss = self.cE * (pred - target).abs().sum() * (world_size / G)
        if self.cF > 0:
            free = self._free(batch)
            f_pred = out["forces"].float()[free]  # [A_local, 3]
            f_true = (batch.forces[free].double() / self.norm["energy_std"]).float()
            loss = loss + self.cF * torch.linalg.vector_norm(f_pred - f_true, dim=-1).sum() * (world_size / max(A, 1.0))
        return loss

    def check_output(self, out, batch) -> None:
        super().check_output(out, batch)
        if self.cF > 0 and "forces" not in out:
            raise KeyError(f"the model returned {sorted(out)} but S2EF needs 'forces' [N, 3]. "
                           "Fix: set model.regress_forces=direct (or gradient).")
        if "forces" in out and tuple(out["forces"].shape) != (batch.num_nodes, 3):
            raise ValueError(f"model 'forces' has shape {tuple(out['forces'].shape)}, expected [{batch.num_nodes}, 3]")

    def metric_names(self) -> List[str]:
        return ["loss", "energy_mae", "forces_mae", "forces_cos", "efwt"]

    def accumulate(self, sums, out, batch) -> None:
        sd = self.norm["energy_std"]
        pred, target = self._energy(out, batch, strict=False)
        free = self._free(batch)
        B = batch.num_graphs
        e_err = (pred.double() - target.double()).abs() * sd  # [B] eV
        e_err0 = target.double().abs() * sd  # mean predictor
        f_true = batch.forces.double()  # [N, 3]
        f_pred = out["forces"].double() * sd if "forces" in out else torch.zeros_like(f_true)
        for prefix, de, fp in (("", e_err, f_pred), ("base_", e_err0, torch.zeros_like(f_true))):
            dF = (fp - f_true)[free]  # [A, 3]
            self._add(sums, prefix + "energy_abs", de)
            self._add(sums, prefix + "forces_abs", dF.abs())
            self._add(sums, prefix + "forces_l2n", torch.linalg.vector_norm(dF / sd, dim=-1))
            cos = torch.nn.functional.cosine_similarity(fp[free], f_true[free], dim=-1, eps=1e-12)
            self._add(sums, prefix + "forces_cos", cos)
            maxerr = torch.zeros(B, dtype=torch.float64, device=f_true.device)
            if dF.numel():
                maxerr = maxerr.scatter_reduce(0, batch.batch[free], dF.abs().amax(dim=-1), reduce="amax", include_self=True)
            ok = (de < EFWT_ENERGY) & (maxerr < EFWT_FORCE)
            self._add(sums, prefix + "efwt", ok.double())
        self._add(sums, "n_graphs", torch.tensor(float(B)))
        self._add(sums, "n_free", free.sum().double())

    def finalize(self, s) -> Dict[str, float]:
        G, A = max(s.get("n_graphs", 0.0), 1.0), max(s.get("n_free", 0.0), 1.0)
        out = {}
        for prefix in ("", "base_"):
            out[prefix + "energy_mae"] = s[prefix + "energy_abs"] / G
            out[prefix + "forces_mae"] = s[prefix + "forces_abs"] / (3 * A)
            out[prefix + "forces_cos"] = s[prefix + "forces_cos"] / A
            out[prefix + "efwt"] = s[prefix + "efwt"] / G
            sd = float(self.norm["energy_std"])
            out[prefix + "loss"] = (self.cE * s[prefix + "energy_abs"] / sd / G
                                    + (self.cF * s[prefix + "forces_l2n"] / A if self.cF > 0 else 0.0))
        return out

    def predictions(self, out, batch) -> Dict[str, np.ndarray]:
        sd = self.norm["energy_std"]
        e = self._total_energy(out, batch)
        res = {"idx": batch.idx.reshape(-1).cpu().numpy(), "sid": batch.sid.reshape(-1).cpu().numpy(),
               "fid": batch.fid.reshape(-1).cpu().numpy(), "natoms": batch.natoms.reshape(-1).cpu().numpy(),
               "energy_pred": e, "energy_true": batch.energy.reshape(-1).double().cpu().numpy(),
               "fixed": batch.fixed.cpu().numpy(), "forces_true": batch.forces.double().cpu().numpy()}
        if "forces" in out:
            res["forces_pred"] = (out["forces"].double() * sd).cpu().numpy()
        return res


class IS2RETask(_EnergyTask):
    name = "is2re"
    primary_metric = "energy_mae"
    units = {"energy_mae": "eV", "energy_ewt": "", "loss": ""}

    def local_counts(self, batch) -> Tensor:
        return torch.tensor([float(batch.num_graphs)], dtype=torch.float64)

    def loss(self, out, batch, global_counts, world_size):
        pred, target = self._energy(out, batch)
        return self.cE * (pred - target).abs().sum() * (world_size / float(global_counts[0]))

    def metric_names(self) -> List[str]:
        return ["loss", "energy_mae", "energy_ewt"]

    def accumulate(self, sums, out, batch) -> None:
        sd = self.norm["energy_std"]
        pred, target = self._energy(out, batch, strict=False)
        for prefix, de in (("", (pred.double() - target.double()).abs() * sd), ("base_", target.double().abs() * sd)):
            self._add(sums, prefix + "energy_abs", de)
            self._add(sums, prefix + "energy_ewt", (de < EFWT_ENERGY).double())
        self._add(sums, "n_graphs", torch.tensor(float(batch.num_graphs)))

    def finalize(self, s) -> Dict[str, float]:
        G = max(s.get("n_graphs", 0.0), 1.0)
        sd = float(self.norm["energy_std"])
        out = {}
        for prefix in ("", "base_"):
            out[prefix + "energy_mae"] = s[prefix + "energy_abs"] / G
            out[prefix + "energy_ewt"] = s[prefix + "energy_ewt"] / G
            out[prefix + "loss"] = self.cE * s[prefix + "energy_abs"] / sd / G
        return out

    def predictions(self, out, batch) -> Dict[str, np.ndarray]:
        return {"idx": batch.idx.reshape(-1).cpu().numpy(), "sid": batch.sid.reshape(-1).cpu().numpy(),
                "energy_pred": self._total_energy(out, batch),
                "energy_true": batch.energy.reshape(-1).double().cpu().numpy()}


# ============================================================================ QM9
class QM9Task(Task):
    name = "qm9"
    primary_metric = "mae_norm"

    def __init__(self, *, targets: Sequence[int], atomref: str = "b3lyp", **kw):
        super().__init__(**kw)
        self.targets = [int(t) for t in targets]
        self.atomref = atomref
        self.T = len(self.targets)
        self.names = [QM9_TARGETS[t] for t in self.targets]
        self.scale = torch.tensor([1000.0 if t in QM9_ENERGY_TARGETS else 1.0 for t in self.targets], dtype=torch.float64)
        self.units = {f"mae_{n}": QM9_UNITS[t] for n, t in zip(self.names, self.targets)}
        self.units.update({"mae_norm": "", "loss": ""})
        self.primary_metric = "mae_norm"

    def columns(self) -> List[int]:
        return [t + 5 if (t in (7, 8, 9, 10) and self.atomref != "none") else t for t in self.targets]

    def fit_normalizers(self, train_dataset, ncfg) -> Dict[str, Tensor]:
        cols = torch.tensor(self.columns(), dtype=torch.long)
        ref = torch.zeros(self.T, 100, dtype=torch.float64)  # per-element reference subtracted from the column
        if self.atomref == "fit":
            if not hasattr(train_dataset, "atomref"):
                raise ValueError("data.atomref=fit needs a dataset with atomref(); Fix: data.atomref=b3lyp")
            for k, t in enumerate(self.targets):
                if t in (7, 8, 9, 10):
                    ref[k] = train_dataset.atomref(t, mode="fit").double() - train_dataset.atomref(t, mode="b3lyp").double()
        if hasattr(train_dataset, "targets") and (self.atomref != "fit" or hasattr(train_dataset, "composition")):
            y = torch.as_tensor(train_dataset.targets, dtype=torch.float64)[:, cols]  # [M, T]
            if self.atomref == "fit":
                comp = torch.as_tensor(train_dataset.composition(), dtype=torch.float64)  # [M, 5] H C N O F
                y = y - comp @ ref[:, [1, 6, 7, 8, 9]].T
        else:
            rows = []
            for s in _sample_iter(train_dataset, ncfg.max_samples, 0):
                rows.append(s.y.reshape(-1).double()[cols] - ref[:, s.atomic_numbers].sum(-1))
            y = torch.stack(rows)
        if y.shape[0] == 0:
            raise ValueError("the training set is empty: cannot fit the QM9 normalisers")
        mean = y.mean(0)
        std = y.std(0) if y.shape[0] > 1 else torch.ones(self.T, dtype=torch.float64)
        std = torch.where(std > 1e-8, std, torch.ones_like(std))
        self.norm = {"mean": mean, "std": std, "ref": ref, "cols": cols}
        return self.norm

    def _targets(self, batch) -> Tensor:
        """Normalised targets [B, T] (float64)."""
        y = batch.y.reshape(batch.num_graphs, -1).double()[:, self.norm["cols"]]  # [B, T]
        if self.atomref == "fit":
            r = self.norm["ref"][:, batch.atomic_numbers].T  # [N, T]
            y = y - _graph_sum(r, batch.batch, batch.num_graphs)
        return (y - self.norm["mean"]) / self.norm["std"]

    def _pred(self, out) -> Tensor:
        if "properties" in out:
            return out["properties"].float()
        return out["energy"].float().reshape(-1, 1)

    def check_output(self, out, batch) -> None:
        if "properties" not in out and not ("energy" in out and self.T == 1):
            raise KeyError(f"the model returned {sorted(out)} but QM9 needs 'properties' [B, {self.T}]. "
                           f"Fix: set model.num_targets={self.T}.")
        p = self._pred(out)
        if tuple(p.shape) != (batch.num_graphs, self.T):
            raise ValueError(f"model 'properties' has shape {tuple(p.shape)}, expected [{batch.num_graphs}, {self.T}]. "
                             f"Fix: set model.num_targets={self.T}.")

    def local_counts(self, batch) -> Tensor:
        return torch.tensor([float(batch.num_graphs)], dtype=torch.float64)

    def loss(self, out, batch, global_counts, world_size):
        target = self._targets(batch).float()
        return (self._pred(out) - target).abs().sum() * (world_size / (float(global_counts[0]) * self.T))

    def metric_names(self) -> List[str]:
        return ["loss", "mae_norm"] + [f"mae_{n}" for n in self.names]

    def accumulate(self, sums, out, batch) -> None:
        t = self._targets(batch)
        p = self._pred(out).double()
        for prefix, err in (("", (p - t).abs()), ("base_", t.abs())):
            self._add(sums, prefix + "abs_norm", err)
            phys = err * self.norm["std"] * self.scale.to(err.device)  # [B, T] in reporting units
            for k, n in enumerate(self.names):
                self._add(sums, f"{prefix}abs_{n}", phys[:, k])
        self._add(sums, "n_graphs", torch.tensor(float(batch.num_graphs)))

    def finalize(self, s) -> Dict[str, float]:
        G = max(s.get("n_graphs", 0.0), 1.0)
        out = {}
        for prefix in ("", "base_"):
            out[prefix + "loss"] = s[prefix + "abs_norm"] / (G * self.T)
            out[prefix + "mae_norm"] = out[prefix + "loss"]
            for n in self.names:
                out[f"{prefix}mae_{n}"] = s[f"{prefix}abs_{n}"] / G
        return out

    def predictions(self, out, batch) -> Dict[str, np.ndarray]:
        std, mean = self.norm["std"], self.norm["mean"]
        scale = self.scale.to(std.device)
        return {"idx": batch.idx.reshape(-1).cpu().numpy(), "sid": batch.sid.reshape(-1).cpu().numpy(),
                "pred": ((self._pred(out).double() * std + mean) * scale).cpu().numpy(),
                "true": ((self._targets(batch) * std + mean) * scale).cpu().numpy(),
                "targets": np.asarray(self.targets)[None].repeat(batch.num_graphs, 0)}


def build_task(data_cfg, trainer_cfg) -> Task:
    kw = dict(energy_coefficient=trainer_cfg.energy_coefficient, force_coefficient=trainer_cfg.force_coefficient)
    if data_cfg.task == "qm9":
        return QM9Task(targets=list(data_cfg.targets), atomref=data_cfg.atomref, **kw)
    # validate() refuses atomref=b3lyp for S2EF/IS2RE; a checkpoint config of an older version may still hold it
    # (the old default): its normalisers then have no fitted references, i.e. "none"
    atomref = "fit" if data_cfg.atomref == "fit" else "none"
    if data_cfg.task == "s2ef":
        return S2EFTask(atomref=atomref, **kw)
    if data_cfg.task == "is2re":
        return IS2RETask(atomref=atomref, **kw)
    raise ValueError(f"unknown data.task {data_cfg.task!r}")
