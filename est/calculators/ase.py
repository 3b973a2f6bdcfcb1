r"""An ASE calculator for est models (energies in eV, forces in eV/A, stress in eV/A^3).

Models predict in the normalised space the trainer fits (docs/CONVENTIONS.md);
the calculator undoes it:

* OC20-style checkpoints (S2EF / IS2RE, normalisers ``energy_mean``
  :math:`\mu`, ``energy_std`` :math:`\sigma` and, trained with
  ``data.atomref=fit``, per-element references ``atomref`` :math:`w`)::

      E = sigma * e + mu + sum_i w[z_i],    F = sigma * f,    stress = sigma * s

  (forces share the energy std and have mean 0; the mean and the references
  are constant per composition, so they add nothing to forces or stress).
  ``E`` is the energy of the training data in its units: total energies for
  total-energy data; for the EMT / OC20 sets the *referenced* energy
  (OC20: adsorption energy relative to the clean slab and gas references).
  An element without a fitted reference (NaN in ``atomref``) is refused.
* QM9 checkpoints (normalisers ``mean``, ``std``, ``ref``, ``cols``) whose
  targets include an energy (U0, U, H, G = 7-10, or their atomisation
  columns 12-15): ``E = std_k p_k + mean_k + sum_i ref_k(z_i)`` plus, for
  targets 7-10 learned as atomisation energies (``atomref=b3lyp``/``fit``),
  QM9's free-atom B3LYP energies, so ``E`` is the total energy in eV.
  Forces and stress are :math:`-\partial E/\partial x` and
  :math:`\frac1V \partial E/\partial\epsilon` by autograd (the graph is
  differentiable in the positions).
* a bare model: ``energy_mean`` / ``energy_std`` keywords (default 0 / 1).

Optional ``atom_references`` (a [Zmax+1] array, eV per atom of element Z) are
added to the energy (e.g. to undo a linear reference the model was trained
without).

Forces: the model's own ``"forces"`` (gradient or direct head); for models
without forces (energy-only, QM9) autograd of the energy. Stress (ASE sign:
:math:`\sigma = \frac1V \partial E/\partial\epsilon`, Voigt order xx yy zz yz xz
xy) for periodic cells from energy models with gradient forces (the model's
``regress_stress`` path, switched on by the calculator when needed) or
energy-only models; direct-force models have no stress (a direct head is not
the derivative of anything).

Checks before a structure reaches the model (:class:`UnsupportedStructureError`):
empty ``Atoms``, non-finite positions or cell, atoms closer than
``min_distance`` (periodic images included), elements the model never saw,
periodic atoms given to a model trained with ``use_pbc=False``, a periodic
direction with a degenerate cell.

Training elements: est.train records them in every checkpoint (``elements``:
from dataset metadata, QM9's composition, or the atoms of the training
samples, at most 2000 random ones; ``elements_source`` says which; pass
``elements=`` to override). Checkpoints written before that fall back, with
a warning, to QM9's H C N O F, the EMT manifest's elements, or every element
the embedding has (``1..max_num_elements-1``).

``checkpoint`` may be a checkpoint file or a run folder (``run_dir``): a
folder means its ``best.pt``, else its ``last.pt``.
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union

import numpy as np
import torch
from ase.calculators.calculator import Calculator, PropertyNotImplementedError, all_changes
from torch import nn

__all__ = ["ESTCalculator", "CheckpointInfo", "UnsupportedStructureError", "load_model_from_checkpoint"]

_QM9_ENERGY = {7: "U0", 8: "U", 9: "H", 10: "G", 12: "U0_atom", 13: "U_atom", 14: "H_atom", 15: "G_atom"}
_QM9_ELEMENTS = (1, 6, 7, 8, 9)


class UnsupportedStructureError(ValueError):
    """The structure cannot be evaluated by this model (see the message for the fix)."""


# ============================================================================ checkpoints
@dataclass
class CheckpointInfo:
    """What :func:`load_model_from_checkpoint` restores besides the model."""

    path: str
    task: str  # "s2ef" | "is2re" | "qm9" | "unknown"
    normalizers: Dict[str, torch.Tensor]
    config: Dict[str, Any]
    elements: Optional[List[int]] = None  # training elements when known
    #: where ``elements`` come from: the checkpoint's record, or the fallback used for older checkpoints
    elements_source: str = "unknown"
    elements_recorded: bool = False
    step: Optional[int] = None
    qm9_targets: List[int] = field(default_factory=list)
    qm9_atomref: str = "b3lyp"


def _training_elements(ck: Mapping[str, Any], cfg: Mapping[str, Any], task: str) -> Optional[List[int]]:
    """Elements seen in training: recorded in the checkpoint, implied by the task, or read from the EMT manifest."""
    return _elements_and_source(ck, cfg, task)[0]


def _elements_and_source(ck: Mapping[str, Any], cfg: Mapping[str, Any], task: str):
    """``(elements or None, where they come from)``; see :func:`_training_elements`."""
    if ck.get("elements"):
        return sorted(int(z) for z in ck["elements"]), str(ck.get("elements_source", "the checkpoint"))
    for name, where in (("data", cfg.get("data") or {}), ("model", cfg.get("model") or {})):
        for key in ("elements", "training_elements"):
            if isinstance(where, Mapping) and where.get(key):
                return sorted(int(z) for z in where[key]), f"the checkpoint's config {name}.{key}"
    if task == "qm9":
        return list(_QM9_ELEMENTS), "QM9's elements"
    return _manifest_elements(cfg), "the EMT data manifest"


def _manifest_elements(cfg: Mapping[str, Any]) -> Optional[List[int]]:
    # an EMT OC20-layout set (est.data.generate) names its metals in OUT/manifest.json, OUT/s2ef/train being the data
    data = cfg.get("data") or {}
    train = data.get("train_path") if isinstance(data, Mapping) else None
    if train:
        manifest = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(str(train)))), "manifest.json")
        if os.path.isfile(manifest):
            try:
                from ase.data import atomic_numbers

                with open(manifest) as fh:
                    man = json.load(fh)
                if "EMT" not in str(man.get("format", "")):
                    return None
                syms = set(man["config"]["metals"])
                for ads in man["config"]["adsorbates"]:
                    syms |= {s for s in ("H", "C", "N", "O") if s in ads}
                return sorted(atomic_numbers[s] for s in syms)
            except Exception:  # a manifest we do not understand: fall back to the embedding range
                return None
    return None


def load_model_from_checkpoint(path: str, *, map_location: Any = "cpu", use_ema: bool = True,
                               model_overrides: Optional[Mapping[str, Any]] = None):
    """Rebuild an est.train checkpoint: ``(model in eval mode, CheckpointInfo)``.

    The model is :func:`est.train.load_trained_model`'s (the checkpoint's
    resolved ``config["model"]``, EMA weights when present and ``use_ema``).
    ``path`` may be a run folder (its ``best.pt``, else ``last.pt``);
    ``model_overrides``: see :func:`est.train.load_trained_model`.
    """
    from est.train.loading import IncompatibleOverrides, load_trained_model
    from est.train.checkpoint import resolve_checkpoint_path

    path = resolve_checkpoint_path(path)
    try:
        model, ck = load_trained_model(path, map_location=map_location, use_ema=use_ema,
                                       model_overrides=dict(model_overrides) if model_overrides else None)
    except IncompatibleOverrides:
        raise  # names its own fix
    except ValueError as err:
        raise ValueError(f"{err}. Fix: pass model=... and normalizers=... to ESTCalculator instead.") from None
    plain = ck["config"]
    data = plain.get("data") or {}
    task = str(data.get("task", "unknown"))
    elements, source = _elements_and_source(ck, plain, task)
    info = CheckpointInfo(
        path=os.path.abspath(path), task=task, normalizers=dict(ck.get("normalizers") or {}), config=plain,
        elements=elements, elements_source=source, elements_recorded=bool(ck.get("elements")), step=ck.get("step"),
        qm9_targets=[int(t) for t in data.get("targets", [])] if task == "qm9" else [],
        qm9_atomref=str(data.get("atomref", "b3lyp")),
    )
    return model, info


# ============================================================================ the calculator
def _symbols(numbers: Iterable[int]) -> List[str]:
    from ase.data import chemical_symbols

    return [chemical_symbols[z] if 0 <= z < len(chemical_symbols) else "?" for z in numbers]


def _sum_tables(*tables: np.ndarray) -> np.ndarray:
    """Elementwise sum of per-element tables of different lengths (missing entries count 0; NaN stays NaN)."""
    size = max((t.size for t in tables), default=0)
    out = np.zeros(size, dtype=np.float64)
    for t in tables:
        out[: t.size] += t
    return out


#: the precisions a calculator evaluates in, by the names MACE's and torch's users write them
DTYPES = {"float32": torch.float32, "float64": torch.float64}


def calculator_dtype(dtype: Union[str, torch.dtype]) -> torch.dtype:
    """``torch.float32`` / ``torch.float64`` from itself or its name (``"float32"``, ``"float64"``, as MACE's
    ``default_dtype``); anything else is a ``ValueError`` naming what is accepted."""
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    if dtype in DTYPES.values():
        return dtype
    raise ValueError(f"dtype must be torch.float32 or torch.float64 (or 'float32' / 'float64'), got {dtype!r}")


def _as_float(v) -> float:
    return float(v.reshape(-1)[0]) if isinstance(v, torch.Tensor) else float(v)


class ESTCalculator(Calculator):
    """ASE calculator for an est model (see the module docstring).

    Args:
        checkpoint: an est.train checkpoint (``last.pt`` / ``best.pt``) or a run folder
            (its ``best.pt``, else ``last.pt``); or give ``model``.
        model: an ``nn.Module`` with ``model(batch) -> {"energy", "forces", ...}``; put in eval
            mode, and copied (not converted in place) when ``dtype``/``device`` differ from its own.
        normalizers: the trainer's normaliser dict (``energy_mean``/``energy_std``
            or QM9's ``mean``/``std``/``ref``/``cols``); with ``model`` only.
        energy_mean, energy_std: scalars instead of ``normalizers``.
        atom_references: per-element energies (eV, indexed by Z) added to E.
        elements: allowed atomic numbers (default: the checkpoint's training
            elements when known, else every element the embedding has).
        qm9_target: which QM9 energy column is "energy" (default: the first of
            U0, U, H, G, U0_atom, ... the checkpoint learned).
        device, dtype: where and in which precision to evaluate (``torch.float32`` or ``torch.float64``,
            or their names ``"float32"`` / ``"float64"``).
        use_ema: load the EMA weights of a checkpoint (default) or the raw ones.
        min_distance: atoms closer than this (A) are refused as overlapping.
        batch_size: default batch size of :meth:`predict_batch`.
        model_overrides: with ``checkpoint``, model options that keep the weights,
            e.g. ``{"est": {"grid": {"degree": 20}}}`` (a finer spherical design;
            :func:`est.train.load_trained_model`).
    """

    implemented_properties = ["energy", "free_energy", "forces", "stress"]
    default_parameters: Dict[str, Any] = {}

    def __init__(self, checkpoint: Optional[str] = None, *, model: Optional[nn.Module] = None,
                 normalizers: Optional[Mapping[str, Any]] = None, energy_mean: Optional[float] = None,
                 energy_std: Optional[float] = None, atom_references: Optional[Sequence[float]] = None,
                 elements: Optional[Iterable[int]] = None, qm9_target: Optional[int] = None,
                 device: Any = "cpu", dtype: Union[str, torch.dtype] = torch.float32, use_ema: bool = True,
                 min_distance: float = 0.5, batch_size: int = 16,
                 model_overrides: Optional[Mapping[str, Any]] = None, **kwargs):
        super().__init__(**kwargs)
        if (checkpoint is None) == (model is None):
            raise ValueError("ESTCalculator needs exactly one of checkpoint=PATH or model=MODULE")
        dtype = calculator_dtype(dtype)
        self.device = torch.device(device)
        self.dtype = dtype
        self.min_distance = float(min_distance)
        self.batch_size = int(batch_size)
        self.info: Optional[CheckpointInfo] = None
        self.elements_source = "the elements= argument" if elements is not None else "the embedding range"
        if checkpoint is not None:
            model, self.info = load_model_from_checkpoint(checkpoint, map_location="cpu", use_ema=use_ema,
                                                          model_overrides=model_overrides)
            if normalizers is None:
                normalizers = self.info.normalizers
            if elements is None:
                elements = self.info.elements
                self.elements_source = self.info.elements_source if elements is not None else self.elements_source
                if not self.info.elements_recorded:
                    fallback = (f"{self.info.elements_source} ({' '.join(_symbols(elements))})" if elements is not None
                                else "every element the embedding has")
                    warnings.warn(f"{self.info.path} does not record its training elements (written before est.train "
                                  f"stored them): allowing {fallback}, so an element absent from training may get an "
                                  "energy. Fix: retrain, or pass elements=[...] (atomic numbers) to ESTCalculator.",
                                  stacklevel=2)
        assert model is not None
        if checkpoint is None:
            ref = next(iter(model.parameters()), None)
            if ref is not None and (ref.dtype != dtype or ref.device != self.device):
                model = copy.deepcopy(model)  # never convert the caller's module in place
        self.model = model.to(device=self.device, dtype=dtype).eval()
        if checkpoint is not None:
            for p in self.model.parameters():
                p.requires_grad_(False)
        self.mcfg = getattr(model, "config", None)
        self.max_z = int(getattr(self.mcfg, "max_num_elements", 119)) - 1
        self.elements = sorted(int(z) for z in elements) if elements is not None else None
        self.use_pbc = bool(getattr(self.mcfg, "use_pbc", True))
        self.force_mode = getattr(self.mcfg, "regress_forces", None)
        self._setup_units(dict(normalizers or {}), energy_mean, energy_std, qm9_target)
        refs = np.zeros(0) if atom_references is None else np.asarray(atom_references, dtype=np.float64).reshape(-1)
        self.atom_references = refs
        self.references = _sum_tables(self.atom_references, self.task_ref)  # [Zmax+1] eV per atom, or empty
        self._ref_on: Dict[torch.device, torch.Tensor] = {}
        if self.force_mode == "direct":
            self.implemented_properties = ["energy", "free_energy", "forces"]
        else:
            self.implemented_properties = ["energy", "free_energy", "forces", "stress"]

    # ---------------------------------------------------------------- construction helpers
    @classmethod
    def from_checkpoint(cls, path: str, **kwargs) -> "ESTCalculator":
        """``ESTCalculator(checkpoint=path, **kwargs)``."""
        return cls(checkpoint=path, **kwargs)

    def _setup_units(self, norm: Dict[str, Any], mean, std, qm9_target) -> None:
        self.scale, self.offset = 1.0, 0.0
        self.prop_index: Optional[int] = None  # QM9: column of "properties"
        self.task_ref = np.zeros(0)  # per-element energies the model was trained on top of, added to E
        if "energy_std" in norm or "energy_mean" in norm:
            self.scale = _as_float(norm.get("energy_std", 1.0))
            self.offset = _as_float(norm.get("energy_mean", 0.0))
            if norm.get("atomref") is not None:  # S2EF / IS2RE with data.atomref=fit (NaN: not fitted)
                self.task_ref = torch.as_tensor(norm["atomref"]).double().cpu().numpy().reshape(-1).copy()
        elif "std" in norm and "mean" in norm:  # QM9
            targets = self.info.qm9_targets if self.info is not None else []
            if not targets:
                raise ValueError("QM9 normalisers need the checkpoint's targets. Fix: load the model with checkpoint=PATH.")
            usable = [t for t in targets if t in _QM9_ENERGY]
            if qm9_target is None:
                if not usable:
                    names = ", ".join(map(str, targets))
                    raise ValueError(f"this QM9 checkpoint learned targets [{names}], none of them an energy "
                                     "(U0/U/H/G = 7-10 or 12-15). Fix: train with data.targets=[7].")
                qm9_target = usable[0]
            if qm9_target not in targets or qm9_target not in _QM9_ENERGY:
                raise ValueError(f"qm9_target={qm9_target} is not an energy target of this checkpoint (energy targets: {usable})")
            k = targets.index(qm9_target)
            self.prop_index = k
            self.scale = float(norm["std"].reshape(-1)[k])
            self.offset = float(norm["mean"].reshape(-1)[k])
            ref = norm["ref"][k].double().numpy().copy() if "ref" in norm else np.zeros(100)
            atomref = self.info.qm9_atomref if self.info is not None else "b3lyp"
            if qm9_target in (7, 8, 9, 10) and atomref != "none":
                from est.data.qm9_formats import B3LYP_ATOM_ENERGIES, HAR2EV

                for z, vals in B3LYP_ATOM_ENERGIES.items():
                    ref[z] += vals[qm9_target - 7] * HAR2EV
            self.task_ref = ref
        if mean is not None:
            self.offset = float(mean)
        if std is not None:
            self.scale = float(std)

    # ---------------------------------------------------------------- checks
    def check_elements(self, numbers: Iterable[int]) -> None:
        """Raise :class:`UnsupportedStructureError` for atomic numbers the model never saw (or cannot embed)."""
        allowed = set(self.elements) if self.elements is not None else set(range(1, self.max_z + 1))
        unseen = sorted(set(int(v) for v in np.asarray(numbers).reshape(-1)) - allowed)
        if unseen:
            names = ", ".join(f"{sym} (Z={v})" for sym, v in zip(_symbols(unseen), unseen))
            known = ("trained on " + " ".join(_symbols(sorted(allowed))) + f" (elements from {self.elements_source})") \
                if self.elements is not None \
                else f"embeds Z=1..{self.max_z}"
            raise UnsupportedStructureError(f"the model never saw {names}: it {known}. "
                                            "Fix: use a model trained with these elements.")

    def check_atoms(self, atoms) -> None:
        """Raise :class:`UnsupportedStructureError` for structures this model cannot evaluate."""
        n = len(atoms)
        if n == 0:
            raise UnsupportedStructureError("empty Atoms: nothing to evaluate. Fix: give at least one atom.")
        pos = np.asarray(atoms.positions, dtype=np.float64)
        if not np.isfinite(pos).all():
            bad = int(np.nonzero(~np.isfinite(pos).all(axis=1))[0][0])
            raise UnsupportedStructureError(f"atom {bad} has non-finite position {pos[bad].tolist()}. "
                                            "Fix: the structure diverged upstream (MD blow-up or a bad file).")
        self.check_elements(atoms.numbers)
        pbc = np.asarray(atoms.pbc, dtype=bool)
        if pbc.any():
            cell = np.asarray(atoms.cell.array, dtype=np.float64)
            if not np.isfinite(cell).all():
                raise UnsupportedStructureError("the cell has non-finite entries. Fix: set a valid cell.")
            if not self.use_pbc:
                raise UnsupportedStructureError(
                    f"atoms are periodic (pbc={pbc.tolist()}) but the model was built with use_pbc=False and would "
                    "ignore periodic images. Fix: atoms.pbc = False (molecules) or a model trained with use_pbc=True.")
            if abs(np.linalg.det(cell)) < 1e-6:
                raise UnsupportedStructureError(f"pbc={pbc.tolist()} but the cell is degenerate (volume "
                                                f"{abs(np.linalg.det(cell)):.3g} A^3). Fix: give three lattice vectors "
                                                "(with vacuum along non-periodic directions) or pbc=False.")
        if n > 1 and self.min_distance > 0:
            from ase.neighborlist import neighbor_list

            i, j, d = neighbor_list("ijd", atoms, self.min_distance, self_interaction=False)
            if len(d):
                k = int(np.argmin(d))
                raise UnsupportedStructureError(
                    f"atoms {int(i[k])} and {int(j[k])} are {d[k]:.3f} A apart (< min_distance={self.min_distance} A): "
                    "overlapping atoms are outside any training data. Fix: check the structure (duplicated atoms, "
                    "wrong units or cell) or lower min_distance.")

    # ---------------------------------------------------------------- evaluation
    def _sample(self, atoms):
        from torch_geometric.data import Data

        n = len(atoms)
        pbc = torch.as_tensor(np.asarray(atoms.pbc, dtype=bool)).reshape(1, 3)
        cell = np.asarray(atoms.cell.array, dtype=np.float64) if bool(pbc.any()) else np.zeros((3, 3))
        return Data(
            pos=torch.as_tensor(np.asarray(atoms.positions, dtype=np.float64), dtype=self.dtype),
            atomic_numbers=torch.as_tensor(np.asarray(atoms.numbers), dtype=torch.long),
            natoms=torch.tensor([n], dtype=torch.long),
            cell=torch.as_tensor(cell, dtype=self.dtype).reshape(1, 3, 3),
            pbc=pbc,
            fixed=torch.zeros(n, dtype=torch.long),
            tags=torch.as_tensor(np.asarray(atoms.get_tags()), dtype=torch.long).reshape(-1),
        )

    @contextlib.contextmanager
    def _stress_enabled(self, on: bool):
        cfg = self.mcfg
        if not on or cfg is None or getattr(cfg, "regress_stress", False) or not hasattr(cfg, "replace"):
            yield
            return
        self.model.config = cfg.replace(regress_stress=True)
        try:
            yield
        finally:
            self.model.config = cfg

    def _normalised_energy(self, out: Dict[str, torch.Tensor]) -> torch.Tensor:
        if self.prop_index is not None:
            return out["properties"][:, self.prop_index]
        if "energy" not in out:
            raise KeyError(f"the model returned {sorted(out)}; the calculator needs 'energy'. Fix: a model with an energy head.")
        return out["energy"].reshape(-1)

    def _forward(self, batch, need_forces: bool, need_stress: bool):
        """Normalised (energy [B], forces [N, 3] | None, stress [B, 3, 3] | None)."""
        periodic = batch.pbc.view(-1, 3).any(dim=1)  # [B]
        stress_on = need_stress and bool(periodic.any())
        if self.force_mode in ("gradient", "direct"):
            with self._stress_enabled(stress_on and self.force_mode == "gradient"):
                out = self.model(batch)
            e = self._normalised_energy(out).detach()
            f = out["forces"].detach() if need_forces else None
            s = out["stress"].detach() if stress_on and "stress" in out else None
            return e, f, s
        # energy-only models (QM9 properties, regress_forces=None): autograd here
        if not (need_forces or stress_on):
            with torch.no_grad():
                return self._normalised_energy(self.model(batch)), None, None
        from est.geometry import apply_strain

        with torch.enable_grad():
            pos = batch.pos.detach().requires_grad_(True)
            b = batch.clone()
            inputs = [pos]
            if stress_on:
                pos_s, cell_s, disp = apply_strain(pos, batch.cell.view(-1, 3, 3), batch.batch)
                b.pos, b.cell = pos_s, cell_s
                inputs.append(disp)
            else:
                b.pos = pos
            e = self._normalised_energy(self.model(b))
            grads = torch.autograd.grad(e.sum(), inputs)
        f = -grads[0]
        s = None
        if stress_on:
            vol = torch.linalg.det(batch.cell.view(-1, 3, 3)).abs()
            safe = torch.where(vol > 1e-12, vol, torch.ones_like(vol))
            s = torch.where((vol > 1e-12)[:, None, None], grads[1] / safe[:, None, None], torch.zeros_like(grads[1]))
        return e.detach(), f, s

    def _reference_energy(self, batch) -> torch.Tensor:
        """``sum_{i in g} references[z_i]`` [B] (float64, eV); zeros without references."""
        z = batch.atomic_numbers
        if self.references.size == 0:
            return torch.zeros(batch.num_graphs, dtype=torch.float64, device=z.device)
        table = self._ref_on.get(z.device)
        if table is None:
            table = self._ref_on[z.device] = torch.as_tensor(self.references, dtype=torch.float64, device=z.device)
        if int(z.max()) >= table.numel():
            raise UnsupportedStructureError(f"no atom reference for Z={int(z.max())} (references cover Z<{table.numel()})")
        per_atom = table[z]  # [N]
        if bool(torch.isnan(per_atom).any()):
            unseen = sorted(set(z[torch.isnan(per_atom)].tolist()))
            raise UnsupportedStructureError(
                f"no fitted energy reference for {', '.join(_symbols(unseen))} (Z={unseen}): the training structures the "
                "references were fitted on had none. Fix: use a model trained with these elements.")
        return torch.zeros(batch.num_graphs, dtype=torch.float64, device=z.device).index_add_(0, batch.batch, per_atom)

    def predict(self, batch, *, stress: bool = False) -> Dict[str, torch.Tensor]:
        """Energies and derivatives of a prepared batch, in physical units (float64, on the model's device).

        ``batch``: a ``torch_geometric`` ``Batch`` of canonical samples in the calculator's dtype and device
        (checks are the caller's: :meth:`check_atoms`, :meth:`check_elements`). Returns ``energy`` [B] eV
        (references included), ``forces`` [N, 3] eV/A and, with ``stress`` and periodic structures,
        ``stress`` [B, 3, 3] eV/A^3 (symmetrised; zeros for non-periodic structures of the batch).
        """
        e, f, s = self._forward(batch, need_forces=True, need_stress=stress)
        out = {"energy": e.double() * self.scale + self.offset + self._reference_energy(batch)}  # [B]
        if f is not None:
            out["forces"] = f.double() * self.scale  # [N, 3]
        if s is not None:
            s = s.double() * self.scale  # [B, 3, 3]
            out["stress"] = 0.5 * (s + s.transpose(-1, -2))
        return out

    def _evaluate(self, atoms_list: Sequence[Any], properties: Sequence[str]) -> List[Dict[str, np.ndarray]]:
        from torch_geometric.data import Batch

        need_stress = "stress" in properties
        if need_stress and self.force_mode == "direct":
            raise PropertyNotImplementedError(
                "stress: this model predicts forces with a direct head, which is not an energy derivative, so it has "
                "no stress. Fix: use a model with regress_forces='gradient'.")
        if need_stress:
            for a in atoms_list:
                if not np.asarray(a.pbc).any():
                    raise PropertyNotImplementedError("stress needs a periodic cell (atoms.pbc is all False)")
        for a in atoms_list:
            self.check_atoms(a)
        batch = Batch.from_data_list([self._sample(a) for a in atoms_list]).to(self.device)
        pred = {k: v.cpu().numpy() for k, v in self.predict(batch, stress=need_stress).items()}
        results = []
        start = 0
        for b, a in enumerate(atoms_list):
            n = len(a)
            energy = float(pred["energy"][b])
            res: Dict[str, Any] = {"energy": energy, "free_energy": energy}
            if "forces" in pred:
                res["forces"] = pred["forces"][start:start + n].copy()
            if "stress" in pred:
                m = pred["stress"][b]
                res["stress"] = np.array([m[0, 0], m[1, 1], m[2, 2], m[1, 2], m[0, 2], m[0, 1]])
            results.append(res)
            start += n
        return results

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        super().calculate(atoms, properties, system_changes)
        self.results.update(self._evaluate([self.atoms], list(properties))[0])

    def predict_batch(self, atoms_list: Sequence[Any], *, batch_size: Optional[int] = None,
                      properties: Sequence[str] = ("energy", "forces")) -> List[Dict[str, Any]]:
        """Evaluate many structures, ``batch_size`` at a time: one result dict per structure
        (``energy``, ``free_energy``, ``forces`` and, when asked for, ``stress``), same values as single calls."""
        bs = int(batch_size or self.batch_size)
        if bs < 1:
            raise ValueError(f"batch_size must be >= 1, got {bs}")
        atoms_list = list(atoms_list)
        out: List[Dict[str, Any]] = []
        for i in range(0, len(atoms_list), bs):
            out.extend(self._evaluate(atoms_list[i:i + bs], properties))
        return out

    def __repr__(self) -> str:
        src = self.info.path if self.info is not None else type(self.model).__name__
        return (f"ESTCalculator({src}, forces={self.force_mode}, scale={self.scale:.4g} eV, offset={self.offset:.4g} eV, "
                f"device={self.device}, dtype={self.dtype})")
