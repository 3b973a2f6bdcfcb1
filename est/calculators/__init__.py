"""Use trained est models from other codes: an ASE calculator.

>>> from est.calculators import ESTCalculator
>>> atoms.calc = ESTCalculator.from_checkpoint("runs/oc20_s2ef_quick/best.pt")
>>> atoms.get_potential_energy(), atoms.get_forces()

See :mod:`est.calculators.ase`.
"""
from .ase import CheckpointInfo, ESTCalculator, UnsupportedStructureError, load_model_from_checkpoint

__all__ = ["ESTCalculator", "CheckpointInfo", "UnsupportedStructureError", "load_model_from_checkpoint"]
