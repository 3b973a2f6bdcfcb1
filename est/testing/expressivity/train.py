r"""Train a fresh classifier per seed on a task and report its accuracy.

Protocol (Joshi et al. 2023, with fresh weights per seed): Adam, cross-entropy,
batch of one graph, the task's graphs are the training, validation and test
set; ``ReduceLROnPlateau`` on validation accuracy. After every epoch the model
is evaluated (``eval()`` mode) on all graphs; a seed's accuracy is the test
accuracy at the epoch of best validation accuracy (the first such epoch), and
the final-epoch accuracy is kept too. ``torch.manual_seed(seed)`` is set
before ``model_factory()``, so weights are re-initialised for every seed and a
run is deterministic for a given seed on CPU. The loop itself is
:func:`.protocol.fit` (plain torch, shared with models trained outside est's
environment).
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn
from torch_geometric.data import Batch

from .protocol import fit
from .tasks import Task

__all__ = ["train_classifier", "evaluate_accuracy"]


def _as_batch(graphs, dtype: torch.dtype) -> Batch:
    b = Batch.from_data_list(list(graphs))
    b.pos = b.pos.to(dtype)
    return b


def _logits(model: nn.Module, batch: Batch, num_classes: int) -> torch.Tensor:
    out = model(batch)
    if not isinstance(out, torch.Tensor) or out.shape != (batch.num_graphs, num_classes):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(
            f"model_factory's model must map a Batch of {batch.num_graphs} graph(s) to logits "
            f"[{batch.num_graphs}, {num_classes}] (the task's num_classes), got {got}"
        )
    return out


@torch.no_grad()
def evaluate_accuracy(model: nn.Module, task: Task, *, dtype: torch.dtype = torch.float32) -> float:
    """Percentage of the task's graphs classified correctly (``eval()`` mode)."""
    was_training = model.training
    model.eval()
    batch = _as_batch(task.graphs, dtype)
    pred = _logits(model, batch, task.num_classes).argmax(dim=-1)  # [B]
    model.train(was_training)
    return 100.0 * float((pred == batch.y.view(-1)).double().mean())


def _train_one(model_factory, task: Task, seed: int, epochs: int, lr: float, dtype: torch.dtype,
               stop_at_perfect: bool) -> dict:
    torch.manual_seed(seed)
    model = model_factory()
    if not isinstance(model, nn.Module):
        raise ValueError(f"model_factory() must return a torch.nn.Module, got {type(model).__name__}")
    model = model.to(dtype)
    batches = [_as_batch([g], dtype) for g in task.graphs]
    return fit(model, batches, [b.y for b in batches], logits=lambda m, b: _logits(m, b, task.num_classes),
               accuracy=lambda m: evaluate_accuracy(m, task, dtype=dtype), seed=seed, epochs=epochs, lr=lr,
               stop_at_perfect=stop_at_perfect)


def train_classifier(
    model_factory: Callable[[], nn.Module],
    task: Task,
    *,
    seeds: int | list[int] = 10,
    epochs: int = 100,
    lr: float = 1e-4,
    dtype: torch.dtype = torch.float32,
    stop_at_perfect: bool = True,
) -> dict:
    """Train ``model_factory()`` afresh for each seed on ``task``.

    Args:
        model_factory: returns a new ``nn.Module`` mapping a PyG ``Batch`` to
            logits ``[B, task.num_classes]``; called after ``torch.manual_seed(seed)``.
        seeds: a count (seeds ``0..n-1``) or an explicit list.
        epochs, lr: Adam steps are ``epochs * len(task.graphs)``.
        dtype: floating dtype of the model and positions.
        stop_at_perfect: stop a seed once validation accuracy is 100% (its reported
            accuracy cannot change after that; ``final_per_seed`` is then at the stop).

    Returns:
        ``{"mean", "std", "per_seed", "final_per_seed", "seeds"}``: accuracies in
        percent (std is the population standard deviation over seeds).
    """
    if not isinstance(task, Task):
        raise ValueError(f"task must be an est.testing.expressivity.Task (make_task(...)), got {type(task).__name__}")
    seed_list = list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
    if not seed_list:
        raise ValueError("train_classifier needs at least one seed")
    if epochs < 1 or not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"train_classifier: epochs must be >= 1 and lr a finite number > 0, got {epochs}, {lr}")
    runs = [_train_one(model_factory, task, s, epochs, lr, dtype, stop_at_perfect) for s in seed_list]
    acc = torch.tensor([r["accuracy"] for r in runs], dtype=torch.float64)
    return dict(
        mean=float(acc.mean()),
        std=float(acc.std(unbiased=False)),
        per_seed=[r["accuracy"] for r in runs],
        final_per_seed=[r["final_accuracy"] for r in runs],
        seeds=seed_list,
    )
