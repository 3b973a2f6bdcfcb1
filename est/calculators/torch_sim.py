r"""A torch-sim model for est checkpoints and models: many structures per call.

:class:`ESTTorchSimModel` implements ``torch_sim.models.interface.ModelInterface``
(package ``torch-sim-atomistic``, ``pip install 'est[torchsim]'``), so an est model
drives torch-sim's batched integrators and optimisers (``ts.integrate``,
``ts.optimize``, ``ts.static``). Units and references are those of
:class:`~est.calculators.ESTCalculator`, which it wraps (same loading through
``est.train.loading.load_trained_model``, same normalisers, fitted energy
references and training elements), so for the same structures both give the
same energies and forces::

    E_g = sigma * e_g + mu + sum_{i in g} w[z_i],   F = sigma * f (or -dE/dx),
    stress_g = (1 / V_g) dE_g / d(strain)   (ASE's sign, [3, 3])

torch-sim conventions (``SimState``): ``positions`` [N, 3] (A), ``cell``
[n_systems, 3, 3] with lattice vectors as **columns** (est and ASE use rows:
the adapter transposes), one ``pbc`` flag for all systems, ``system_idx`` [N].
torch-sim 0.3 sets that flag to ``all(atoms.pbc)``: an OC20-style slab
(``pbc = [True, True, False]``) would be evaluated without periodic images, so
set ``atoms.pbc = True`` on slabs first (their vacuum keeps the z images apart).
Returns ``energy`` [n_systems] (eV), ``forces`` [N, 3] (eV/A) and, for periodic
states when ``compute_stress``, ``stress`` [n_systems, 3, 3] (eV/A^3), all
detached, in the model's dtype (float32 or float64); the input state is not
modified. Non-periodic states get no ``stress`` (there is no cell to strain).

Checks on every call (:class:`~est.calculators.UnsupportedStructureError`):
elements outside the training set, non-finite positions, a periodic state for a
model built with ``use_pbc=False``, a degenerate periodic cell. The ASE
calculator's overlapping-atoms check is not repeated per step (it needs a
neighbour list per structure on the CPU); run ``ESTCalculator.check_atoms`` on
the starting structures when in doubt.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Union

import torch

from .ase import ESTCalculator, UnsupportedStructureError

try:
    from torch_sim.models.interface import ModelInterface
except ImportError as _exc:  # torch-sim is optional
    _IMPORT_ERROR: Optional[ImportError] = _exc

    class ModelInterface(torch.nn.Module):  # type: ignore[no-redef]
        """Placeholder: constructing :class:`ESTTorchSimModel` without torch-sim raises an ImportError."""
else:
    _IMPORT_ERROR = None

__all__ = ["ESTTorchSimModel"]


def _field(state: Any, name: str) -> Any:
    return state[name] if isinstance(state, Mapping) else getattr(state, name)


class ESTTorchSimModel(ModelInterface):
    """torch-sim ``ModelInterface`` for an est checkpoint (or model); see the module docstring.

    Args:
        checkpoint: an est.train checkpoint or run folder; or give ``model`` (with
            ``normalizers`` / ``energy_mean`` / ``energy_std`` in ``calculator_kwargs``).
        model: an ``nn.Module`` returning ``{"energy", "forces", ...}``.
        device: where to evaluate (default: CUDA when available, else CPU).
        dtype: ``torch.float64`` (default, as torch-sim's MD) or ``torch.float32`` (or ``"float64"`` / ``"float32"``).
        compute_forces: return forces (always possible: model head or autograd).
        compute_stress: return stress for periodic states; default: whenever the model can
            (not for direct-force models, whose forces are not an energy derivative).
        **calculator_kwargs: passed to :class:`ESTCalculator` (``normalizers``, ``elements``,
            ``use_ema``, ``qm9_target``, ``atom_references``, ...).
    """

    def __init__(self, checkpoint: Optional[str] = None, *, model: Optional[torch.nn.Module] = None,
                 device: Union[str, torch.device, None] = None, dtype: Union[str, torch.dtype] = torch.float64,
                 compute_forces: bool = True, compute_stress: Optional[bool] = None, **calculator_kwargs):
        if _IMPORT_ERROR is not None:
            raise ImportError(f"ESTTorchSimModel needs torch-sim ({_IMPORT_ERROR}). "
                              "Fix: pip install torch-sim-atomistic (or pip install 'est[torchsim]'); Python >= 3.11.")
        super().__init__()
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.calculator = ESTCalculator(checkpoint, model=model, device=device, dtype=dtype, **calculator_kwargs)
        self.model = self.calculator.model  # a registered submodule: .parameters(), .eval() reach it
        self._device = self.calculator.device
        self._dtype = self.calculator.dtype
        can_stress = self.calculator.force_mode != "direct"
        if compute_stress and not can_stress:
            raise ValueError("compute_stress=True, but this model predicts forces with a direct head, which is not "
                             "an energy derivative, so it has no stress. Fix: a model with regress_forces='gradient'.")
        self._compute_forces = bool(compute_forces)
        self._compute_stress = can_stress if compute_stress is None else bool(compute_stress)
        self._memory_scales_with = "n_atoms_x_density"  # radius-graph models: edges grow with density

    def _batch(self, state: Any):
        """The state as a ``torch_geometric`` batch of canonical samples (new tensors; the state is untouched)."""
        from torch_geometric.data import Batch

        pos = _field(state, "positions").to(device=self._device, dtype=self._dtype)  # [N, 3]
        z = _field(state, "atomic_numbers").to(device=self._device, dtype=torch.long)  # [N]
        system_idx = _field(state, "system_idx").to(device=self._device, dtype=torch.long)  # [N]
        cell = _field(state, "cell").to(device=self._device, dtype=self._dtype)  # [S, 3, 3], columns
        pbc = bool(_field(state, "pbc"))
        S = int(cell.shape[0])
        counts = torch.bincount(system_idx, minlength=S)  # [S]
        if not bool(torch.isfinite(pos).all()):
            bad = int((~torch.isfinite(pos).all(dim=1)).nonzero()[0, 0])
            raise UnsupportedStructureError(f"atom {bad} has non-finite position {pos[bad].tolist()}. "
                                            "Fix: the simulation diverged (smaller timestep) or the input is bad.")
        self.calculator.check_elements(torch.unique(z).cpu().numpy())
        if pbc:
            if not self.calculator.use_pbc:
                raise UnsupportedStructureError(
                    "the state is periodic (pbc=True) but the model was built with use_pbc=False and would ignore "
                    "periodic images. Fix: pbc=False (molecules) or a model trained with use_pbc=True.")
            vol = torch.linalg.det(cell).abs()  # [S]
            if bool((vol < 1e-6).any()):
                k = int((vol < 1e-6).nonzero()[0, 0])
                raise UnsupportedStructureError(f"system {k} is periodic but its cell is degenerate (volume "
                                                f"{float(vol[k]):.3g} A^3). Fix: three lattice vectors (vacuum along "
                                                "non-periodic directions) or pbc=False.")
        rows = cell.transpose(-1, -2) if pbc else torch.zeros_like(cell)  # [S, 3, 3], lattice vectors as rows
        zeros = torch.zeros_like(z)
        return Batch(pos=pos, atomic_numbers=z, batch=system_idx, ptr=torch.cat([counts.new_zeros(1), counts.cumsum(0)]),
                     natoms=counts, cell=rows, pbc=torch.full((S, 3), pbc, dtype=torch.bool, device=self._device),
                     fixed=zeros, tags=zeros)

    def forward(self, state: Any, **kwargs) -> Dict[str, torch.Tensor]:
        """``{"energy": [S], "forces": [N, 3], "stress": [S, 3, 3]}`` (detached; see the module docstring)."""
        batch = self._batch(state)
        stress = self._compute_stress and bool(batch.pbc.any())
        pred = self.calculator.predict(batch, stress=stress)
        out = {"energy": pred["energy"].to(self._dtype)}
        if self._compute_forces:
            out["forces"] = pred["forces"].to(self._dtype)
        if stress:
            out["stress"] = pred["stress"].to(self._dtype)
        return out
