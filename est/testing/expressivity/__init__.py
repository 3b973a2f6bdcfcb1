"""Expressivity suite: can a model tell apart geometric graphs that differ only
in ways some architectures cannot see? Point it at your own layer::

    from est.testing.expressivity import make_task, train_classifier, est_classifier
    task = make_task("rotsym", fold=3)
    print(train_classifier(lambda: est_classifier(update="est", lmax=3, readout=task.readout), task))

* :func:`make_task`: ``"rotsym"`` (k-fold rotational symmetry), ``"kchain"``
  (depth), ``"counterexample"`` (body order); see :mod:`.tasks`.
* :func:`train_classifier`: fresh weights per seed, mean/std/per-seed accuracy.
* :func:`separation`: how far apart the classes' outputs are at initialisation
  (float64), next to the rotation floor: can the architecture separate the pair
  at all, before asking whether training finds it.
* :func:`est_classifier` (est's EquiformerV2-style layers, ``update="ffn" | "est" |
  "spherical"``) and :func:`tensor_product_classifier` (e3nn TFN/NequIP-style).
"""
from .models import (
    ClassifierConfig,
    ESTClassifier,
    TensorProductClassifier,
    est_classifier,
    tensor_product_classifier,
)
from .tasks import TASKS, Task, congruent, descriptors, make_task
from .separation import separation
from .train import evaluate_accuracy, train_classifier

__all__ = [
    "make_task",
    "Task",
    "TASKS",
    "descriptors",
    "congruent",
    "train_classifier",
    "evaluate_accuracy",
    "separation",
    "est_classifier",
    "ESTClassifier",
    "ClassifierConfig",
    "tensor_product_classifier",
    "TensorProductClassifier",
]
