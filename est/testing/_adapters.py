r"""How a model is called on one structure: adapters ``adapter(system) -> {name: tensor}``.

Two adapters ship:

* :class:`BatchModelAdapter` for the est model contract
  (``model(batch) -> {"energy" [B], "forces" [N, 3], "stress" [B, 3, 3],
  "properties" [B, T]}``, ``batch`` a ``torch_geometric`` Batch with the
  fields of ``docs/CONVENTIONS.md``); graph dimensions are squeezed.
* :class:`CallableAdapter` for anything else (e3nn, MACE, fairchem, ASE
  calculators wrapped in a function): ``fn(positions [n, 3], numbers [n],
  cell [3, 3] | None, pbc [3]) -> dict``.

How each output transforms comes from its name (``energy``: invariant;
``forces``, ``dipole``: vectors; ``stress``, ``virial``: rank 2, ``R S R^T``;
anything else invariant) unless ``output_types`` says otherwise, e.g.
``{"properties": "vector"}`` for a ``[B, 3]`` vector property.
"""
from __future__ import annotations

import contextlib
import inspect
from typing import Any, Callable, Mapping

import torch

from ._cast import DTYPE_HINT, is_dtype_error, resolve_dtype
from ._reps import Rep, as_rep
from ._system import System

__all__ = ["Adapter", "BatchModelAdapter", "CallableAdapter", "as_adapter", "DEFAULT_OUTPUT_TYPES"]

#: how outputs transform, by name (anything else: invariant)
DEFAULT_OUTPUT_TYPES = {
    "energy": "graph_scalar",
    "free_energy": "graph_scalar",
    "forces": "vector",
    "dipole": "vector",
    "stress": "rank2",
    "virial": "rank2",
    "properties": "graph_scalar",
}
_GRAPH_KEYS = ("energy", "free_energy", "stress", "virial", "properties", "dipole")


class Adapter:
    """Base class: ``adapter(system) -> {name: tensor}`` for one structure.

    Subclasses set ``dtype`` (the dtype the model runs in, which sets the
    default tolerance) and may override :meth:`output_rep`.
    """

    dtype: torch.dtype = torch.float64
    output_types: Mapping[str, Any] = {}
    name: str = "model"

    def __call__(self, system: System) -> dict[str, torch.Tensor]:  # pragma: no cover - interface
        raise NotImplementedError

    def output_rep(self, key: str, value: torch.Tensor, num_atoms: int) -> Rep:
        """How output ``key`` transforms: ``output_types``, then :data:`DEFAULT_OUTPUT_TYPES`, else invariant."""
        rep = as_rep(self.output_types.get(key, DEFAULT_OUTPUT_TYPES.get(key, "scalar")))
        per_atom = rep.per_atom
        if key == "forces":
            per_atom = True
        elif key in _GRAPH_KEYS:
            per_atom = False
        return Rep(rep.kind, irreps=rep.irreps, per_atom=per_atom)


@contextlib.contextmanager
def _eval(model: Any):
    if isinstance(model, torch.nn.Module) and model.training:
        model.eval()
        try:
            yield
        finally:
            model.train()
    else:
        yield


@contextlib.contextmanager
def _dtype_hint(name: str, dtype: torch.dtype):
    """Mixed-dtype errors from inside the model, re-raised with the fix."""
    try:
        yield
    except RuntimeError as err:
        if is_dtype_error(err):
            raise RuntimeError(f"check_model: {name} failed with {dtype} positions: {err}. {DTYPE_HINT}") from err
        raise


def _detach(out: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Outputs as detached CPU tensors (comparisons run on the CPU, in float64)."""
    return {k: v.detach().cpu() for k, v in out.items() if isinstance(v, torch.Tensor)}


def _model_device(model: Any) -> torch.device:
    if isinstance(model, torch.nn.Module):
        for p in list(model.parameters()) + list(model.buffers()):
            return p.device
    return torch.device("cpu")


class CallableAdapter(Adapter):
    """Any ``fn(positions [n, 3], numbers [n], cell [3, 3] | None, pbc [3]) -> dict``.

    Args:
        fn: the callable; positions and cell are passed in ``dtype``, on
            ``device`` (default: the module's device, else the CPU).
        dtype: what the check runs in (sets the default tolerance): float64
            by default, ``"model"`` for a module's own dtype. A module in
            another dtype is copied and cast (yours is not changed).
        output_types: ``{output name: representation}`` overrides
            (``"vector"``, ``"rank2"``, ``"scalar"``, an e3nn Irreps, ...).
    """

    def __init__(
        self,
        fn: Callable,
        *,
        dtype: torch.dtype | str | None = None,
        device: torch.device | str | None = None,
        output_types: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> None:
        self.name = name or getattr(fn, "__name__", type(fn).__name__)
        self.fn, self.dtype = resolve_dtype(fn, dtype)
        self.device = torch.device(device) if device is not None else _model_device(fn)
        self.output_types = dict(output_types or {})

    def __call__(self, system: System) -> dict[str, torch.Tensor]:
        dev = self.device
        cell = None if system.cell is None else system.cell.to(device=dev, dtype=self.dtype)
        with _eval(self.fn), _dtype_hint(self.name, self.dtype):
            out = self.fn(system.pos.to(device=dev, dtype=self.dtype), system.numbers.to(dev), cell, system.pbc.to(dev))
        if not isinstance(out, Mapping):
            raise TypeError(f"{self.name} must return a dict of outputs (e.g. {{'energy': ..., 'forces': ...}}), got {type(out).__name__}")
        return _detach(out)


class BatchModelAdapter(Adapter):
    """An est-contract model: ``model(batch) -> dict`` with graph-level outputs ``[B, ...]``.

    Builds a one-graph ``torch_geometric`` Batch with the fields of
    ``docs/CONVENTIONS.md`` (pos in ``dtype``; cell zeros for molecules;
    ``fixed``/``tags`` from the sample or zeros) and squeezes the graph
    dimension of ``energy``, ``stress``, ``properties`` and any output whose
    first dimension is 1 while the structure has more atoms.

    Args:
        dtype: what the check runs in: float64 by default, ``"model"`` for the
            model's own parameter dtype. A model in another dtype is copied
            and cast (yours is not changed); positions and cell are passed in it.
        device: where the batch goes (default: the model's device); outputs
            come back to the CPU for the comparisons.
    """

    def __init__(
        self,
        model: Callable,
        *,
        dtype: torch.dtype | str | None = None,
        device: torch.device | str | None = None,
        output_types: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> None:
        self.name = name or type(model).__name__
        self.model, self.dtype = resolve_dtype(model, dtype)
        self.device = torch.device(device) if device is not None else _model_device(model)
        self.output_types = dict(output_types or {})

    def batch(self, system: System):
        from torch_geometric.data import Batch, Data

        n = system.num_atoms
        cell = torch.zeros(3, 3, dtype=torch.float64) if system.cell is None else system.cell
        fields = dict(
            pos=system.pos.to(self.dtype),
            atomic_numbers=system.numbers,
            natoms=torch.tensor([n], dtype=torch.long),
            cell=cell.to(self.dtype).reshape(1, 3, 3),
            pbc=system.pbc.reshape(1, 3),
            fixed=torch.zeros(n, dtype=torch.long),
            tags=torch.zeros(n, dtype=torch.long),
            sid=torch.zeros(1, dtype=torch.long),
            fid=torch.zeros(1, dtype=torch.long),
            idx=torch.zeros(1, dtype=torch.long),
        )
        fields.update(system.atom_fields)
        return Batch.from_data_list([Data(**fields)]).to(self.device)

    def __call__(self, system: System) -> dict[str, torch.Tensor]:
        with _eval(self.model), _dtype_hint(self.name, self.dtype):
            out = self.model(self.batch(system))
        if not isinstance(out, Mapping):
            raise TypeError(f"{self.name}(batch) must return a dict (model contract), got {type(out).__name__}")
        res = {}
        n = system.num_atoms
        for k, v in _detach(out).items():
            if v.dim() >= 1 and v.shape[0] == 1 and (k in _GRAPH_KEYS or n > 1):
                v = v[0]  # drop the graph dimension (B = 1)
            res[k] = v
        return res


def as_adapter(
    model: Any, *, dtype: torch.dtype | str | None = None, output_types: Mapping[str, Any] | None = None
) -> Adapter:
    """An :class:`Adapter` for ``model``: adapters pass through; callables of four (or more)
    parameters get :class:`CallableAdapter`; one-argument models (``model(batch)``) get
    :class:`BatchModelAdapter`. ``dtype``: float64 by default (see :class:`BatchModelAdapter`)."""
    if isinstance(model, Adapter):
        return model
    if not callable(model):
        raise TypeError(f"check_model: model must be callable, got {type(model).__name__}")
    target = model.forward if isinstance(model, torch.nn.Module) else model
    try:
        params = [
            p for p in inspect.signature(target).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
        ]
        nparams = len(params)
    except (TypeError, ValueError):
        nparams = 1
    if nparams >= 3:
        return CallableAdapter(model, dtype=dtype, output_types=output_types)
    if nparams == 1:
        return BatchModelAdapter(model, dtype=dtype, output_types=output_types)
    raise TypeError(
        f"check_model: cannot tell how to call {type(model).__name__}: it takes {nparams} required arguments. "
        "Expected model(batch) (est contract) or fn(positions, numbers, cell, pbc); wrap it in "
        "est.testing.CallableAdapter / BatchModelAdapter"
    )
