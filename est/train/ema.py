"""Exponential moving average of the weights, used for evaluation.

``shadow <- d_t * shadow + (1 - d_t) * param`` after every optimiser step,
with ``d_t = min(decay, (1 + t) / (10 + t))`` (t = number of updates so far),
so early evaluations are not dominated by the random initialisation.
Buffers are copied. The shadow is a full copy of the module (``ema.module``),
evaluated directly.
"""
from __future__ import annotations

import copy
from typing import Any, Dict

import torch
from torch import nn

__all__ = ["EMA"]


class EMA:
    def __init__(self, model: nn.Module, *, decay: float):
        self.decay = float(decay)
        self.num_updates = 0
        self.module = copy.deepcopy(model)
        self.module.eval()
        for p in self.module.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        self.num_updates += 1
        d = min(self.decay, (1.0 + self.num_updates) / (10.0 + self.num_updates))
        src = dict(model.named_parameters())
        for name, p in self.module.named_parameters():
            p.lerp_(src[name].detach(), 1.0 - d)
        bsrc = dict(model.named_buffers())
        for name, b in self.module.named_buffers():
            if name in bsrc:
                b.copy_(bsrc[name])

    def state_dict(self) -> Dict[str, Any]:
        return {"module": self.module.state_dict(), "num_updates": self.num_updates, "decay": self.decay}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.module.load_state_dict(state["module"])
        self.num_updates = int(state["num_updates"])
