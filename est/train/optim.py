"""AdamW parameter groups and EquiformerV2's warmup + cosine learning-rate shape.

Learning rate at optimiser step ``s`` is ``lr * f(s)`` with (fairchem's
``CosineLRLambda``, as used by EquiformerV2)::

    f(s) = w + (1 - w) * s / S_w                            for s <= S_w (linear warmup)
    f(s) = m + (1 - m) * (1 + cos(pi * s / S)) / 2          for S_w < s < S
    f(s) = m                                                for s >= S

with warmup factor ``w`` (0.2), minimum factor ``m`` (0.01), ``S_w`` warmup
steps and ``S`` total steps. Note the cosine runs over ``s / S`` (not over the
steps after warmup), exactly as in EquiformerV2.
"""
from __future__ import annotations

import math
from typing import Dict, Iterable, List, Optional, Set

import torch
from torch import nn

__all__ = ["CosineWarmup", "param_groups", "build_optimizer"]


class CosineWarmup:
    """``f(step)`` of the module docstring; a picklable callable for ``LambdaLR``."""

    def __init__(self, *, warmup_steps: int, total_steps: int, warmup_factor: float = 0.2, lr_min_factor: float = 0.01):
        self.warmup_steps = int(warmup_steps)
        self.total_steps = max(1, int(total_steps))
        self.warmup_factor = float(warmup_factor)
        self.lr_min_factor = float(lr_min_factor)

    def __call__(self, step: int) -> float:
        if self.warmup_steps > 0 and step <= self.warmup_steps:
            alpha = step / float(self.warmup_steps)
            return self.warmup_factor * (1.0 - alpha) + alpha
        if step >= self.total_steps:
            return self.lr_min_factor
        return self.lr_min_factor + 0.5 * (1.0 - self.lr_min_factor) * (1.0 + math.cos(math.pi * step / self.total_steps))


def _no_decay_names(model: nn.Module) -> Set[str]:
    """1-D parameters (biases, norm scales), names containing 'norm', plus ``model.no_weight_decay()``."""
    extra: Set[str] = set()
    if hasattr(model, "no_weight_decay"):
        extra = set(model.no_weight_decay())
    out = set()
    for name, p in model.named_parameters():
        if p.ndim <= 1 or "norm" in name.lower() or name in extra or any(name.startswith(e + ".") for e in extra):
            out.add(name)
    return out


def param_groups(model: nn.Module, weight_decay: float) -> List[Dict]:
    """Two AdamW groups: decayed weights and the rest (weight_decay 0)."""
    skip = _no_decay_names(model)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if name in skip else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def build_optimizer(model: nn.Module, *, lr: float, weight_decay: float, betas=(0.9, 0.999)) -> torch.optim.AdamW:
    """AdamW without weight decay on biases and norm parameters."""
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=tuple(betas))
