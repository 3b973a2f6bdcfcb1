r"""Weight initialisation schemes for the backbone (``ModelConfig.weight_init``).

* ``"eqv2"`` (EquiformerV2's, as in fairchem 1.10 and the released EST code,
  applied to the whole model including the EST block):

  - every ``nn.Linear`` and :class:`~est.nn.DegreeLinear` (fairchem's
    ``SO3_LinearV2``) outside the radial MLPs: bias 0,
    :math:`W \sim \mathcal N(0, 1/\text{fan\_in})`;
  - the linears of every :class:`~est.nn.radial.RadialMLP` (fairchem's
    ``RadialFunction``): bias 0, :math:`W \sim \mathcal U(-1/\sqrt{\text{fan\_in}}, 1/\sqrt{\text{fan\_in}})`;
  - layer norms: weight 1, bias 0; embeddings and attention vectors keep their
    constructors' initialisation (the same as EquiformerV2's).

* ``"torch"``: PyTorch's defaults (``nn.Linear``: weight and bias
  :math:`\mathcal U(\pm 1/\sqrt{\text{fan\_in}})`, i.e. a weight variance 3x
  smaller than ``"eqv2"``), the constructors' own choices elsewhere.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..nn.linear import DegreeLinear
from ..nn.radial import RadialMLP

__all__ = ["WEIGHT_INITS", "init_weights_"]

WEIGHT_INITS = ("eqv2", "torch")


def _normal_(weight: torch.Tensor, fan_in: int) -> None:
    nn.init.normal_(weight, 0.0, 1.0 / math.sqrt(fan_in))


@torch.no_grad()
def init_weights_(model: nn.Module, scheme: str) -> nn.Module:
    """Re-initialise ``model``'s weights in place with ``scheme`` (see module docstring); returns ``model``."""
    if scheme not in WEIGHT_INITS:
        raise ValueError(f"weight_init must be one of {WEIGHT_INITS}, got {scheme!r}")
    if scheme == "torch":
        return model
    radial_linears = {id(m) for r in model.modules() if isinstance(r, RadialMLP) for m in r.modules()
                      if isinstance(m, nn.Linear)}
    for m in model.modules():
        if isinstance(m, nn.Linear):
            if m.bias is not None:
                m.bias.zero_()
            if id(m) in radial_linears:
                bound = 1.0 / math.sqrt(m.in_features)
                nn.init.uniform_(m.weight, -bound, bound)
            else:
                _normal_(m.weight, m.in_features)
        elif isinstance(m, DegreeLinear):
            if m.bias is not None:
                m.bias.zero_()
            _normal_(m.weight, m.in_channels)
        elif isinstance(m, nn.LayerNorm) and m.elementwise_affine:
            m.weight.fill_(1.0)
            if m.bias is not None:
                m.bias.zero_()
    return model
