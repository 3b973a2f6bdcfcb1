"""``mode=eval``: a checkpoint's metrics, predictions and parity plots on chosen splits.

The model, task and normalisers come from the checkpoint's own config
(:mod:`est.train.loading`); ``data.*``, ``eval_splits``, ``run_dir`` and
``trainer.*`` given on the command line replace the checkpoint's. The
evaluation itself is :func:`est.train.evaluation.evaluate`, as in training.
"""
from __future__ import annotations

import json
import os
import warnings
from typing import Any, Dict, Optional, Sequence

import numpy as np
from omegaconf import DictConfig, OmegaConf

from .checkpoint import load_checkpoint
from .config import ConfigError
from .data import build_datasets
from .distributed import DistInfo, broadcast_object, setup_distributed
from .evaluation import evaluate
from .loading import build_model_from_config, checkpoint_config, model_state
from .logs import plot_parity, summary_table
from .report import parity_pairs
from .run_dir import check_run_dir
from .tasks import build_task

__all__ = ["evaluate_checkpoint"]


def evaluate_checkpoint(cfg: DictConfig, overrides: Sequence[str] = (), *, datasets: Optional[Dict[str, Any]] = None,
                        info: Optional[DistInfo] = None) -> Dict[str, Dict[str, float]]:
    """``mode=eval``: metrics and a predictions file of a checkpoint on ``eval_splits``.

    The model, task and normalisers come from the checkpoint's own config;
    ``data.*``, ``eval_splits`` and ``run_dir`` given on the command line
    replace the checkpoint's. Writes ``<run_dir>/eval/{metrics,predictions}_<split>.*``.
    """
    path = cfg.ckpt or os.path.join(cfg.run_dir, "best.pt")
    ck = load_checkpoint(path)
    base = checkpoint_config(ck)
    user = [o.lstrip("+") for o in overrides if not o.lstrip("+").split("=")[0] in ("mode", "ckpt", "experiment")]
    keep = [o for o in user if o.split("=")[0].split(".")[0] in ("data", "eval_splits", "run_dir", "trainer")]
    ecfg = OmegaConf.merge(base, OmegaConf.from_dotlist(keep)) if keep else base
    ecfg.eval_splits = list(cfg.eval_splits) if not any(o.startswith("eval_splits") for o in keep) else ecfg.eval_splits
    info = info or setup_distributed(ecfg.trainer.device)
    problem = broadcast_object(check_run_dir(os.path.abspath(ecfg.run_dir)) if info.is_main else None, info)
    if problem:  # before any data is read
        raise ConfigError(problem)
    task = build_task(ecfg.data, ecfg.trainer)
    task.load_state_dict(ck["normalizers"])
    task.to(info.device)
    module = build_model_from_config(ecfg).to(info.device)
    module.load_state_dict(model_state(ck))
    ds = datasets if datasets is not None else build_datasets(ecfg.data, info, splits=tuple(ecfg.eval_splits))
    amp = bool(ecfg.trainer.amp and info.device.type == "cuda")
    grad = ecfg.trainer.grad_in_eval if ecfg.trainer.grad_in_eval is not None else (
        ecfg.model.get("regress_forces") == "gradient" or getattr(module, "regress_forces", None) == "gradient")
    out_dir = os.path.join(os.path.abspath(ecfg.run_dir), "eval")
    results = {}
    for s in ecfg.eval_splits:
        if s not in ds:
            raise ConfigError(f"eval split {s!r} has no data. Fix: set data.{s}_path or choose eval_splits from {sorted(ds)}.")
        m, p = evaluate(module, task, ds[s], data=ecfg.data, info=info, grad=grad, amp=amp,
                        prefetch=ecfg.trainer.prefetch, collect=True)
        results[s] = m
        if info.is_main:
            os.makedirs(out_dir, exist_ok=True)
            np.savez(os.path.join(out_dir, f"predictions_{s}.npz"), **p)
            with open(os.path.join(out_dir, f"metrics_{s}.json"), "w") as f:
                json.dump({"checkpoint": os.path.abspath(path), "split": s, "metrics": m}, f, indent=2)
            try:
                plot_parity(parity_pairs(task, p), os.path.join(out_dir, f"parity_{s}.png"))
            except Exception as exc:
                warnings.warn(f"plotting failed: {exc}")
    if info.is_main:
        names = [m for m in task.metric_names() if m != "loss"]
        print(f"[est.train] {path}:\n{summary_table(results, names, task.units)}\n[est.train] predictions in {out_dir}")
    return results
