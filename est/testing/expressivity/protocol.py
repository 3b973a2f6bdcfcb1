r"""The expressivity suite's training protocol and separation measure, in plain torch.

This file imports nothing but ``torch`` (no est, no PyG) so that a model which
cannot live in est's environment is trained by the very same loop: MACE pins
e3nn 0.4.4, so ``benchmarks/baseline/mace_expressivity.py`` runs in the MACE
venv and loads this file by its path. :func:`est.testing.expressivity.train_classifier`
and :func:`~est.testing.expressivity.separation` call it too.

Protocol (Joshi et al. 2023, fresh weights per seed): Adam (learning rate
``lr``), cross-entropy, one graph per step in a seeded random order, the
task's graphs are the training, validation and test set, ``ReduceLROnPlateau``
(factor 0.9, patience 5, floor 1e-5) on validation accuracy. A seed's accuracy
is the accuracy at the first epoch of best validation accuracy; the last
epoch's is kept too.

Separation of two logit vectors :math:`a, b`:
:math:`\lVert a - b\rVert / \tfrac12(\lVert a\rVert + \lVert b\rVert)`.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn

__all__ = ["fit", "relative", "class_separation", "rotation_floor"]


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """:math:`\\lVert a - b\\rVert / \\tfrac12(\\lVert a\\rVert + \\lVert b\\rVert)` (0 when both are 0)."""
    scale = 0.5 * (a.norm() + b.norm())
    return float((a - b).norm() / scale) if scale > 0 else 0.0


def class_separation(z: torch.Tensor, labels: Sequence[int]) -> float:
    """The hardest pair decides: min of :func:`relative` over graphs ``a, b`` of different classes
    (``z`` ``[B, classes]``, the logits of all the task's graphs)."""
    return min(relative(z[a], z[b]) for a in range(len(labels)) for b in range(a + 1, len(labels))
               if labels[a] != labels[b])


def rotation_floor(z: torch.Tensor, z_rotated: torch.Tensor) -> float:
    """max over rotations ``r`` and graphs ``g`` of ``relative(z_rotated[r, g], z[g])`` (``z_rotated`` ``[R, B, classes]``)."""
    return max(relative(z_rotated[r, g], z[g]) for r in range(z_rotated.shape[0]) for g in range(z.shape[0]))


def fit(
    model: nn.Module,
    batches: Sequence,
    labels: Sequence[torch.Tensor],
    *,
    logits: Callable[[nn.Module, object], torch.Tensor],
    accuracy: Callable[[nn.Module], float],
    seed: int,
    epochs: int,
    lr: float,
    stop_at_perfect: bool = True,
) -> dict:
    """Train ``model`` (already built under ``torch.manual_seed(seed)``) by the protocol above.

    Args:
        model: the classifier, in its training dtype.
        batches: one single-graph batch per graph, in any form ``logits`` accepts.
        labels: ``labels[i]`` is ``[1]`` long, the class of ``batches[i]``.
        logits: ``logits(model, batch) -> [1, num_classes]``.
        accuracy: ``accuracy(model) -> percent`` over all the task's graphs (it sets ``eval()`` itself).
        seed: seeds the order of the graphs within each epoch.
        stop_at_perfect: stop once accuracy is 100% (the reported accuracy cannot change after that).

    Returns:
        ``{"accuracy", "best_epoch", "final_accuracy"}``.

    Raises:
        ValueError: no trainable parameters, a non-finite loss, or parameters that never changed.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("model_factory's model has no trainable parameters (requires_grad=True)")
    start = [p.detach().clone() for p in params]
    opt = torch.optim.Adam(params, lr=lr, foreach=True)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", factor=0.9, patience=5, min_lr=1e-5)
    order = torch.Generator().manual_seed(seed)
    best_val, best_epoch = -1.0, -1
    acc = 0.0
    for epoch in range(epochs):
        model.train()
        for i in torch.randperm(len(batches), generator=order).tolist():
            loss = nn.functional.cross_entropy(logits(model, batches[i]), labels[i].view(-1))
            if not torch.isfinite(loss):
                raise ValueError(f"non-finite loss at epoch {epoch} (seed {seed}): lower lr or check the model")
            opt.zero_grad()
            loss.backward()
            opt.step()
        acc = accuracy(model)  # val = test = the task's graphs
        sched.step(acc)
        if acc > best_val:
            best_val, best_epoch = acc, epoch
        if stop_at_perfect and acc == 100.0:
            break  # the best-validation accuracy cannot change any more
    if all(torch.equal(p0, p.detach()) for p0, p in zip(start, params)):
        raise ValueError(
            "the model's parameters did not change during training: check that forward() uses them and that "
            "gradients reach them (e.g. no torch.no_grad / detach in forward)"
        )
    return dict(accuracy=best_val, best_epoch=best_epoch, final_accuracy=acc)
