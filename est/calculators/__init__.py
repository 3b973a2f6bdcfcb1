"""Use trained est models from other codes: an ASE calculator and a torch-sim model.

>>> from est.calculators import ESTCalculator
>>> atoms.calc = ESTCalculator.from_checkpoint("runs/oc20_s2ef_quick/best.pt")
>>> atoms.get_potential_energy(), atoms.get_forces()

>>> from est.calculators.torch_sim import ESTTorchSimModel   # pip install 'est[torchsim]'
>>> final = ts.integrate(atoms_list, ESTTorchSimModel("runs/oc20_s2ef_quick/best.pt"), integrator=ts.nve, ...)

See :mod:`est.calculators.ase` and :mod:`est.calculators.torch_sim` (imported on first use of
``ESTTorchSimModel``, so ``import est.calculators`` never imports torch-sim).
"""
from .ase import CheckpointInfo, ESTCalculator, UnsupportedStructureError, load_model_from_checkpoint

__all__ = ["ESTCalculator", "CheckpointInfo", "UnsupportedStructureError", "load_model_from_checkpoint"]


def __getattr__(name):
    if name == "ESTTorchSimModel":
        from .torch_sim import ESTTorchSimModel

        return ESTTorchSimModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
