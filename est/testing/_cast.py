"""The dtype a check runs in: float64 unless asked otherwise, without touching the caller's module."""
from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import torch

__all__ = ["module_dtype", "resolve_dtype", "is_dtype_error", "default_dtype", "DTYPE_HINT"]

DTYPE_HINT = (
    "est.testing checks in float64 by default (the module is copied and cast, plain functions get float64 "
    "inputs); for a function that computes in another dtype pass dtype=torch.float32, or dtype='model' to "
    "check a module in its own dtype"
)


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[torch.dtype]:
    """``torch``'s default dtype set to ``dtype`` inside the block, restored after it.

    For building models in float64: e3nn (coupling tables) and fairchem (Wigner-D
    tables) compute constants in the default dtype, and constants made in float32
    and cast afterwards keep float32 round-off (~1e-10 in an e3nn model's outputs).
    """
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield dtype
    finally:
        torch.set_default_dtype(old)


def module_dtype(fn: Any) -> torch.dtype | None:
    """The dtype of ``fn``'s first floating parameter (else buffer); ``None`` for non-modules."""
    if isinstance(fn, torch.nn.Module):
        for t in list(fn.parameters()) + list(fn.buffers()):
            if t.is_floating_point():
                return t.dtype
    return None


def resolve_dtype(fn: Any, dtype: torch.dtype | str | None, *, inputs: Sequence[Any] = ()) -> tuple[Any, torch.dtype]:
    """``(fn to call, dtype to check in)``.

    ``dtype=None``: float64. ``"model"``: the module's own dtype (for a plain
    function: that of the first floating input, else float64). A module whose
    parameters are in another dtype is deep-copied and cast, so the caller's
    module keeps its dtype and its weights.
    """
    own = module_dtype(fn)
    if dtype is None:
        dtype = torch.float64
    elif dtype == "model":
        floats = [t.dtype for t in inputs if isinstance(t, torch.Tensor) and t.is_floating_point()]
        dtype = own or (floats[0] if floats else torch.float64)
    elif not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch.dtype, 'model' or None (float64), got {dtype!r}")
    if own is not None and own != dtype:
        try:
            fn = copy.deepcopy(fn).to(dtype)
        except Exception as err:  # noqa: BLE001 - modules holding handles, generators, ...
            raise TypeError(
                f"cannot copy {type(fn).__name__} to cast it from {own} to {dtype} ({type(err).__name__}: {err}); "
                f"cast it yourself (model.to({dtype})) or pass dtype='model' to check it in {own}"
            ) from err
    return fn, dtype


def is_dtype_error(err: BaseException) -> bool:
    """A torch error that looks like mixed dtypes (float64 inputs into float32 weights, ...)."""
    msg = str(err)
    return any(w in msg for w in ("dtype", "Double", "Float", "Half", "BFloat16"))
