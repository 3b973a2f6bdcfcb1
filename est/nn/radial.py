r"""Radial (distance) features of edges and the MLPs that read them.

* :class:`GaussianRadialBasis`: EquiformerV2's Gaussian smearing,
  :math:`\phi_k(r) = \exp\!\big(-(r-\mu_k)^2 / (2\sigma^2)\big)` with centres
  :math:`\mu_k` = ``linspace(start, cutoff, num_basis)`` and one width
  :math:`\sigma` = ``width_factor`` x centre spacing; optionally carries a
  smooth cutoff :class:`PolynomialEnvelope`.
* :class:`PolynomialEnvelope`: :math:`u(r)` with :math:`u(0)=1` that vanishes
  at the cutoff together with its first and second derivatives. Layers
  multiply their messages by it so that an edge entering or leaving the
  cutoff sphere changes the output smoothly (needed for energy-conserving
  forces :math:`-\partial E/\partial x`).
* :class:`RadialMLP`: ``Linear -> LayerNorm -> SiLU`` stacks ending in a plain
  ``Linear`` (EquiformerV2's ``RadialFunction``).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..sphere.masters import Float64Masters

__all__ = ["GaussianRadialBasis", "PolynomialEnvelope", "RadialMLP", "ENVELOPES"]

ENVELOPES = ("polynomial", None)


class PolynomialEnvelope(nn.Module):
    r"""Smooth cutoff :math:`u(r)`, the polynomial part of DimeNet's envelope.

    With :math:`x = r / r_c` and exponent :math:`p`:

    .. math::
        u(x) = 1 - \tfrac{(p+1)(p+2)}{2} x^p + p(p+2) x^{p+1}
               - \tfrac{p(p+1)}{2} x^{p+2}\quad (x < 1),\qquad u = 0\ (x \ge 1).

    :math:`u(1) = u'(1) = u''(1) = 0` and :math:`u(0) = 1`; ``forward(r [E]) -> [E]``.
    """

    def __init__(self, *, cutoff: float, exponent: int = 5) -> None:
        super().__init__()
        if not cutoff > 0:
            raise ValueError(f"PolynomialEnvelope: cutoff must be > 0, got {cutoff}")
        if exponent < 1:
            raise ValueError(f"PolynomialEnvelope: exponent must be >= 1, got {exponent}")
        self.cutoff, self.exponent = float(cutoff), int(exponent)

    def extra_repr(self) -> str:
        return f"cutoff={self.cutoff}, exponent={self.exponent}"

    def forward(self, r: torch.Tensor) -> torch.Tensor:
        p = self.exponent
        x = (r / self.cutoff).clamp(0.0, 1.0)  # [E]; clamped so u = 0 (and u' = 0) beyond the cutoff
        xp = x.pow(p)
        u = 1.0 - 0.5 * (p + 1) * (p + 2) * xp + p * (p + 2) * xp * x - 0.5 * p * (p + 1) * xp * x * x
        return u  # [E]


class GaussianRadialBasis(Float64Masters):
    r"""Gaussians of the edge length, ``forward(r [E]) -> [E, num_basis]``.

    :math:`\phi_k(r) = \exp(-(r - \mu_k)^2 / (2\sigma^2))`, :math:`\mu_k` =
    ``linspace(start, cutoff, num_basis)``, :math:`\sigma` = ``width_factor``
    :math:`\cdot(\mu_1 - \mu_0)`. EquiformerV2: ``num_basis=600``,
    ``start=0``, ``width_factor=2``.

    Args:
        num_basis: number of Gaussians (>= 2).
        cutoff: last centre; also the envelope's cutoff (Angstrom).
        start: first centre.
        width_factor: width in units of the centre spacing.
        envelope: ``"polynomial"`` (attribute :attr:`envelope` is a
            :class:`PolynomialEnvelope`) or ``None`` (EquiformerV2: no envelope).
        envelope_exponent: ``p`` of the polynomial envelope.

    The basis itself is not multiplied by the envelope: message-passing layers
    read ``envelope(r)`` from the edge frame and weight their messages with it.
    """

    def __init__(
        self,
        *,
        num_basis: int = 600,
        cutoff: float,
        start: float = 0.0,
        width_factor: float = 2.0,
        envelope: str | None = None,
        envelope_exponent: int = 5,
    ) -> None:
        super().__init__()
        if num_basis < 2:
            raise ValueError(f"GaussianRadialBasis: num_basis must be >= 2, got {num_basis}")
        if not cutoff > start:
            raise ValueError(f"GaussianRadialBasis: cutoff ({cutoff}) must exceed start ({start})")
        if width_factor <= 0:
            raise ValueError(f"GaussianRadialBasis: width_factor must be > 0, got {width_factor}")
        if envelope not in ENVELOPES:
            raise ValueError(f"GaussianRadialBasis: unknown envelope {envelope!r}; expected one of {ENVELOPES}")
        self.num_basis, self.width_factor = num_basis, width_factor
        self.cutoff, self.start = float(cutoff), float(start)
        centres = torch.linspace(start, cutoff, num_basis, dtype=torch.float64)  # [R]
        self.register_master("centres", centres)  # float64 master: exact centres after any cast
        self.sigma = width_factor * (cutoff - start) / (num_basis - 1)
        self.envelope = (
            PolynomialEnvelope(cutoff=cutoff, exponent=envelope_exponent) if envelope == "polynomial" else None
        )

    @property
    def num_output(self) -> int:
        return self.num_basis

    def extra_repr(self) -> str:
        return (
            f"num_basis={self.num_basis}, start={self.start}, cutoff={self.cutoff}, "
            f"width_factor={self.width_factor}"
        )

    def forward(self, r: torch.Tensor) -> torch.Tensor:
        if r.dim() != 1:
            raise ValueError(f"GaussianRadialBasis: expected edge lengths [E], got shape {tuple(r.shape)}")
        z = (r[:, None] - self.centres.to(r.dtype)) / self.sigma  # [E, R]
        return torch.exp(-0.5 * z * z)  # [E, R]


class RadialMLP(nn.Sequential):
    r"""``channels = [c_0, c_1, ..., c_n]``: :math:`n` Linear layers (with bias);
    every one but the last is followed by ``LayerNorm(c_i)`` and SiLU.

    ``forward(s [..., c_0]) -> [..., c_n]``. Parameters:
    :math:`\sum_{i=1}^{n} (c_{i-1}+1) c_i + \sum_{i=1}^{n-1} 2 c_i`.
    """

    def __init__(self, *, channels: Sequence[int]) -> None:
        channels = [int(c) for c in channels]
        if len(channels) < 2 or min(channels) < 1:
            raise ValueError(f"RadialMLP: channels must list >= 2 positive sizes, got {channels}")
        layers: list[nn.Module] = []
        for i, (c_in, c_out) in enumerate(zip(channels[:-1], channels[1:])):
            layers.append(nn.Linear(c_in, c_out))
            if i < len(channels) - 2:
                layers += [nn.LayerNorm(c_out), nn.SiLU()]
        super().__init__(*layers)
        self.channels = channels

    @property
    def in_channels(self) -> int:
        return self.channels[0]

    @property
    def out_channels(self) -> int:
        return self.channels[-1]
