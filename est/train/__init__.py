"""Training and evaluation for QM9 and OC20 (S2EF, IS2RE): one CPU, one GPU or many.

Entry point: ``python train.py +experiment=qm9_quick`` (see :mod:`est.train.cli`).
Library use::

    from est.train import Trainer, load_config
    cfg = load_config(["+experiment=qm9_quick", "trainer.max_steps=50"])
    Trainer(cfg).fit()

Modules: :mod:`~est.train.config` (validated Hydra configs), :mod:`~est.train.trainer`
(the loop, checkpoints, evaluation) with :mod:`~est.train.run_dir`, :mod:`~est.train.signals`,
:mod:`~est.train.nonfinite` and :mod:`~est.train.report`, :mod:`~est.train.eval_mode` (``mode=eval``),
:mod:`~est.train.tasks` (normalisers, losses, metrics), :mod:`~est.train.sampler` (global batches split across ranks),
:mod:`~est.train.data` (datasets, loaders, prefetching), :mod:`~est.train.optim`
(AdamW groups, EquiformerV2's LR shape), :mod:`~est.train.ema`,
:mod:`~est.train.checkpoint`, :mod:`~est.train.loading` (trained models from checkpoints), :mod:`~est.train.evaluation`, :mod:`~est.train.logs`, :mod:`~est.train.distributed`.
"""
import importlib
from typing import Any

_EXPORTS = {
    "config": ["ConfigError", "DataConfig", "TrainConfig", "TrainerConfig", "load_config", "register_configs", "validate"],
    "ema": ["EMA"],
    "optim": ["CosineWarmup", "build_optimizer", "param_groups"],
    "sampler": ["GlobalBatchSampler", "split_balanced"],
    "tasks": ["QM9Task", "S2EFTask", "IS2RETask", "build_task"],
    "trainer": ["Trainer"],
    "nonfinite": ["NonFiniteLossError"],
    "eval_mode": ["evaluate_checkpoint"],
    "loading": ["build_model_from_config", "load_trained_model", "model_state"],
    "evaluation": ["evaluate"],
}
_WHERE = {name: mod for mod, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    # lazy: `python train.py` with a config error answers before torch is imported
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
