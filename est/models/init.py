r"""Weight initialisation schemes for the backbone (``ModelConfig.weight_init``).

EquiformerV2 (fairchem 1.10, ``eqv2_init_weights``) zeroes the bias of every
linear layer, sets layer norms to weight 1 / bias 0 and draws the linears of
its radial MLPs from :math:`\mathcal U(\pm 1/\sqrt{\text{fan\_in}})`; its
``weight_init`` option then decides the other linear weights:

* ``"eqv2"`` (EquiformerV2's published OC20 configs, ``weight_init: uniform``):
  the weights keep :math:`\mathcal U(\pm 1/\sqrt{\text{fan\_in}})`, PyTorch's
  default for ``nn.Linear`` and our :class:`~est.nn.DegreeLinear`'s; only the
  biases change (zero). ``benchmarks/bench_init_vs_fairchem.py`` checks the
  statistics against fairchem's model.
* ``"eqv2-normal"`` (fairchem's class default ``weight_init="normal"``): linear
  weights outside the radial MLPs :math:`\sim\mathcal N(0, 1/\text{fan\_in})`
  (3x the variance), zero biases.
* ``"torch"``: PyTorch's defaults, including biases
  :math:`\mathcal U(\pm 1/\sqrt{\text{fan\_in}})`.

Embeddings and attention vectors keep their constructors' initialisation
(the same as EquiformerV2's). The EST block's layers follow the same rule
(the released EST module is built inside EquiformerV2's model class).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..nn.linear import DegreeLinear
from ..nn.radial import RadialMLP

__all__ = ["WEIGHT_INITS", "init_weights_"]

WEIGHT_INITS = ("eqv2", "eqv2-normal", "torch")


@torch.no_grad()
def init_weights_(model: nn.Module, scheme: str) -> nn.Module:
    """Re-initialise ``model``'s weights in place with ``scheme`` (see module docstring); returns ``model``."""
    if scheme not in WEIGHT_INITS:
        raise ValueError(f"weight_init must be one of {WEIGHT_INITS}, got {scheme!r}")
    if scheme == "torch":
        return model
    radial = {id(m) for r in model.modules() if isinstance(r, RadialMLP) for m in r.modules()}
    for m in model.modules():
        if isinstance(m, (nn.Linear, DegreeLinear)):
            if m.bias is not None:
                m.bias.zero_()
            if scheme == "eqv2-normal" and id(m) not in radial:
                fan_in = m.in_features if isinstance(m, nn.Linear) else m.in_channels
                nn.init.normal_(m.weight, 0.0, 1.0 / math.sqrt(fan_in))
        elif isinstance(m, nn.LayerNorm) and m.elementwise_affine:
            m.weight.fill_(1.0)
            if m.bias is not None:
                m.bias.zero_()
    return model
