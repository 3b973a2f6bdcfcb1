r"""Separation at initialisation: can the architecture tell the classes apart at all?

Accuracy after training mixes two questions: whether a model *can* give the
task's graphs different outputs (expressivity), and whether the optimiser finds
that difference within the protocol's budget (trainability). A model whose
outputs for the two classes are equal to round-off can never be trained to
separate them; one whose outputs differ by 1e-8 can in principle, but a
gradient that small is easily lost (in float32 it is below round-off).

For seed :math:`s` (``torch.manual_seed(s)``, then ``model_factory()`` called with
float64 as the default dtype, so that e3nn's coupling tables are float64 too;
``eval()``), with logits :math:`z_g` of every graph :math:`g`:

.. math::

    d_s = \min_{(a, b):\, y_a \ne y_b} \frac{\lVert z_a - z_b \rVert}
          {\tfrac12 (\lVert z_a \rVert + \lVert z_b \rVert)}

(the hardest pair of graphs of different classes decides). For a task with an
invariant readout the *rotation floor* is the same relative change of one
graph's logits under random rotations,
:math:`f_s = \max_{g, R} \lVert z_{Rg} - z_g \rVert / \lVert z_g \rVert`: an
exactly invariant model gives round-off, an approximately equivariant one its
error. A separation well above the floor is the architecture's; a separation at
the floor may be an artefact of broken symmetry (the question the rotsym
study asks of the paper preset). For an equivariant readout (``rotsym``) the
logits rotate by design, so there is no floor (``None``).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ...so3 import random_rotation
from .._cast import default_dtype
from .protocol import class_separation, rotation_floor
from .tasks import Task
from .train import _as_batch, _logits

__all__ = ["separation"]


def _rotated(graph, R: torch.Tensor):
    g = graph.clone()
    g.pos = graph.pos @ R.T  # [n, 3]
    return g


@torch.no_grad()
def separation(
    model_factory: Callable[[], nn.Module],
    task: Task,
    *,
    seeds: int | list[int] = 3,
    rotations: int = 4,
) -> dict:
    """Relative difference of the logits of the task's classes at initialisation (float64).

    Args:
        model_factory: as for :func:`train_classifier` (a fresh model per call).
        seeds: a count (``0..n-1``) or an explicit list; one initialisation each.
        rotations: random rotations per graph for the rotation floor (invariant readout only).

    Returns:
        ``{"per_seed", "max", "min", "floor_per_seed", "floor", "seeds"}``: ``d_s`` per seed and
        its max / min over seeds; ``f_s`` per seed and its max (``None`` for an equivariant readout).
    """
    if not isinstance(task, Task):
        raise ValueError(f"task must be an est.testing.expressivity.Task (make_task(...)), got {type(task).__name__}")
    seed_list = list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
    if not seed_list:
        raise ValueError("separation needs at least one seed")
    if rotations < 1:
        raise ValueError(f"separation: rotations must be >= 1, got {rotations}")
    labels = [int(g.y) for g in task.graphs]
    if len(set(labels)) < 2:
        raise ValueError(f"{task!r} has no two graphs of different classes")
    invariant = task.readout == "invariant"
    sep, floor = [], []
    for seed in seed_list:
        torch.manual_seed(seed)
        with default_dtype(torch.float64):
            model = model_factory()
        if not isinstance(model, nn.Module):
            raise ValueError(f"model_factory() must return a torch.nn.Module, got {type(model).__name__}")
        model = model.to(torch.float64).eval()
        z = _logits(model, _as_batch(task.graphs, torch.float64), task.num_classes)  # [B, classes]
        sep.append(class_separation(z, labels))
        if invariant:
            gen = torch.Generator().manual_seed(seed)
            Rs = random_rotation(rotations, dtype=torch.float64, generator=gen)  # [rotations, 3, 3]
            turned = [_rotated(g, R) for R in Rs for g in task.graphs]
            zr = _logits(model, _as_batch(turned, torch.float64), task.num_classes)  # [rotations * B, classes]
            zr = zr.view(rotations, len(task.graphs), -1)  # [rotations, B, classes]
            floor.append(rotation_floor(z, zr))
    return dict(
        per_seed=sep,
        max=max(sep),
        min=min(sep),
        floor_per_seed=floor if invariant else None,
        floor=max(floor) if invariant else None,
        seeds=seed_list,
    )
