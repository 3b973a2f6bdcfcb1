"""Equivariance testing: point it at a layer, a model or a checkpoint.

* :func:`assert_equivariant` / :func:`equivariance_report`: layers on irreps
  features (our ``[N, K, C]`` layout or e3nn's ``[N, irreps.dim]``).
* :func:`check_model`: whole models (est models or any callable
  ``(positions, numbers, cell, pbc) -> outputs``) on molecules and periodic
  cells; returns an :class:`EquivarianceReport`.
* :func:`check_modules`: the same rotation test for every submodule's node
  features (forward hooks): where inside a model equivariance is lost.
* :mod:`est.testing.pytest_plugin`: fixtures and the ``equivariance`` marker.
* ``python -m est.testing.check``: the report for a checkpoint or a config.
* :func:`default_dtype`: build a model under float64 (e3nn and fairchem make
  their constant tables in the default dtype).
"""
from ._cast import default_dtype
from ._layers import assert_equivariant, equivariance_report
from ._modules import check_modules
from ._adapters import DEFAULT_OUTPUT_TYPES, Adapter, BatchModelAdapter, CallableAdapter, as_adapter
from ._models import check_model
from ._report import CheckRow, EquivarianceReport, Tolerance, default_tolerance
from ._reps import Rep, as_rep
from ._rotations import (
    axis_angle_to_matrix,
    describe_rotation,
    matrix_to_axis_angle,
    search_worst_rotation,
    special_rotations,
)
from ._system import System, as_system

__all__ = [
    "assert_equivariant",
    "equivariance_report",
    "check_model",
    "check_modules",
    "Adapter",
    "BatchModelAdapter",
    "CallableAdapter",
    "as_adapter",
    "System",
    "as_system",
    "DEFAULT_OUTPUT_TYPES",
    "EquivarianceReport",
    "CheckRow",
    "Tolerance",
    "default_tolerance",
    "Rep",
    "as_rep",
    "axis_angle_to_matrix",
    "matrix_to_axis_angle",
    "describe_rotation",
    "search_worst_rotation",
    "special_rotations",
    "default_dtype",
]
