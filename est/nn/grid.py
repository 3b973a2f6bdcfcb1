"""A small config naming a point set and normalisation, and the input checks the layers share."""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import nn

from ..so3._layout import check_lmax, num_coefficients
from ..sphere import SphericalFourierTransform

__all__ = [
    "GridConfig",
    "check_features",
    "check_dtype",
    "check_positive",
    "is_float16",
    "warn_float16",
    "check_float16_output",
]

FLOAT16_ADVICE = (
    "bfloat16 is the supported low precision: torch.autocast(device_type, dtype=torch.bfloat16) "
    "(or run in float32)"
)


@dataclass(kw_only=True)
class GridConfig:
    """Which sphere points and transform normalisation a layer samples on.

    Fields map 1:1 to :class:`est.sphere.SphericalFourierTransform`.
    """

    kind: str = "design"
    num_points: int | None = None
    degree: int | None = None
    resolution: tuple[int, int] | None = None
    normalization: str = "quadrature"
    relax_steps: int = 0

    def build(self, lmax: int, *, degree_scaling: str = "none") -> SphericalFourierTransform:
        """The transform; ``degree_scaling`` is the user layer's amplitude convention (not a point-set choice)."""
        return SphericalFourierTransform(
            lmax,
            kind=self.kind,
            num_points=self.num_points,
            normalization=self.normalization,
            degree=self.degree,
            resolution=None if self.resolution is None else tuple(self.resolution),
            relax_steps=self.relax_steps,
            degree_scaling=degree_scaling,
        )


def check_positive(config, names: tuple[str, ...], *, owner: str, lmax: bool = True) -> None:
    """``ValueError`` unless ``config.lmax`` is valid and every field in ``names`` is an int >= 1."""
    if lmax:
        check_lmax(config.lmax)
    for f in names:
        v = getattr(config, f)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{owner}: {f} must be an integer >= 1, got {v!r}; set it to a positive value")


def check_dtype(x: torch.Tensor, module: nn.Module, name: str) -> None:
    """``TypeError`` if ``x`` and ``module``'s floating weights differ in dtype (allowed under autocast)."""
    w = next((p for p in module.parameters() if p.is_floating_point()), None)
    if w is None or x.dtype == w.dtype or torch.is_autocast_enabled(x.device.type):
        return
    caster = {torch.float64: "double()", torch.float32: "float()", torch.bfloat16: "bfloat16()", torch.float16: "half()"}
    raise TypeError(
        f"{name}: input is {x.dtype} but the weights are {w.dtype}; cast one to match: the module with "
        f"module.{caster.get(x.dtype, f'to({x.dtype})')} (e.g. model.double() for float64 inputs) or the input "
        f"with x.to({w.dtype}); for mixed precision use torch.autocast instead of casting inputs"
    )


def is_float16(x: torch.Tensor) -> bool:
    """Whether ``x`` is float16 or float16 autocast is active on its device (no host sync)."""
    dev = x.device.type
    return x.dtype == torch.float16 or (torch.is_autocast_enabled(dev) and torch.get_autocast_dtype(dev) == torch.float16)


def warn_float16(name: str) -> None:
    """Warn (once per call site) that a sphere-sampling layer runs in float16."""
    warnings.warn(
        f"{name} in float16: its sphere samples sum (L+1)^2 coefficients without a pre-norm, so features of "
        "magnitude of a few 1e3 (measured at L=6) exceed float16's range (65504) and turn into inf/NaN; " + FLOAT16_ADVICE,
        RuntimeWarning,
        stacklevel=3,
    )


def check_float16_output(out: torch.Tensor, name: str) -> None:
    """``FloatingPointError`` if a float16 run produced inf/NaN from finite inputs (one host sync)."""
    if not bool(torch.isfinite(out).all()):
        raise FloatingPointError(
            f"{name}: float16 overflow: the output contains inf/NaN although the input was finite; "
            + FLOAT16_ADVICE
        )


def check_features(
    x: torch.Tensor,
    *,
    lmax: int,
    channels: int,
    name: str,
    check_finite: bool = True,
    module: nn.Module | None = None,
) -> None:
    """``ValueError`` unless ``x`` is finite ``[N, (lmax+1)^2, channels]``; with ``module``,
    ``TypeError`` if its weights have another dtype (:func:`check_dtype`)."""
    K = num_coefficients(lmax)
    if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[1] != K or x.shape[2] != channels:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(
            f"{name}: expected features [N, K={K}, C={channels}] for lmax={lmax} "
            f"(K = (lmax+1)^2), got {shape}"
        )
    if module is not None:
        check_dtype(x, module, name)
    if check_finite and x.numel() and not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name}: input features contain NaN or inf")
