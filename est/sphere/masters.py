"""Constant tables kept in float64 and re-derived on every cast of their module."""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["Float64Masters"]


class Float64Masters(nn.Module):
    """Mixin for modules with constant tables (grids, quadrature weights, fixed biases).

    :meth:`register_master` keeps a float64 CPU master and a non-persistent
    buffer in the module's dtype; every ``.to()``, ``.double()``, ``.float()``
    re-derives the buffer from the master, so ``.float().double()`` (or a
    module built under a float32 default dtype, then cast) loses no precision.
    """

    def register_master(self, name: str, value: torch.Tensor) -> None:
        if not hasattr(self, "_masters"):
            self._masters: dict[str, torch.Tensor] = {}
        self._masters[name] = value.detach().to(device="cpu", dtype=torch.float64)
        self.register_buffer(name, value.to(torch.get_default_dtype()), persistent=False)

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        for name, master in getattr(self, "_masters", {}).items():
            buf = getattr(self, name)
            setattr(self, name, master.to(device=buf.device, dtype=buf.dtype))
        return out
