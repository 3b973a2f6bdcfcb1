"""A small config naming a point set and normalisation, and a checker for features."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..so3._layout import num_coefficients
from ..sphere import SphericalFourierTransform

__all__ = ["GridConfig", "check_features"]


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


def check_features(x: torch.Tensor, *, lmax: int, channels: int, name: str, check_finite: bool = True) -> None:
    """``ValueError`` unless ``x`` is finite ``[N, (lmax+1)^2, channels]``."""
    K = num_coefficients(lmax)
    if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[1] != K or x.shape[2] != channels:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(
            f"{name}: expected features [N, K={K}, C={channels}] for lmax={lmax} "
            f"(K = (lmax+1)^2), got {shape}"
        )
    if check_finite and x.numel() and not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name}: input features contain NaN or inf")
