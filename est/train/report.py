"""The end-of-run report: held-out table, timing line, learning-curve and parity plots, ``final_metrics.json``.

:func:`write_final_report` runs on the main rank after the final evaluation;
``final_metrics.json`` is written last and atomically, since its presence
(naming the final step) is what marks a run as finished
(:mod:`est.train.run_dir`). Plots never fail a run: a plotting error is a
warning.
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Dict, Optional

import numpy as np

from .logs import plot_learning_curve, plot_parity, summary_table
from .run_dir import write_json_atomic
from .tasks import Task

__all__ = ["parity_pairs", "write_final_report"]


def parity_pairs(task: Task, p: Dict[str, np.ndarray]) -> Dict[str, tuple]:
    """``{panel title: (true, predicted)}`` of collected predictions ``p``: one panel a QM9 target, or energy and
    forces (free atoms only)."""
    if task.name == "qm9":
        return {f"{n} [{task.units.get('mae_' + n, '')}]": (p["true"][:, k], p["pred"][:, k]) for k, n in enumerate(task.names)}
    out = {"energy [eV]": (p["energy_true"], p["energy_pred"])}
    if "forces_pred" in p:
        free = p["fixed"] == 0
        out["forces [eV/A]"] = (p["forces_true"][free], p["forces_pred"][free])
    return out


def write_final_report(run_dir: str, *, task: Task, results: Dict[str, Dict[str, float]],
                       preds: Dict[str, Dict[str, np.ndarray]], step: int, best: Dict[str, Any], monitor: str,
                       timing: Optional[Dict[str, Any]], plots: bool) -> None:
    """Print the held-out table (model vs mean predictor) and the timing line, plot, then write ``final_metrics.json``.

    ``results``/``preds``: metrics and collected predictions per split;
    ``best``: the best evaluation (``{"metric", "value", "step"}``);
    ``timing``: the training totals (``steps``, ``time``, ``samples``, ``wait``).
    """
    if results:
        names = [m for m in task.metric_names() if m != "loss"]
        table = summary_table(results, names, task.units)
        print(f"\n[est.train] held-out results (best EMA weights, step {best.get('step')}) vs the mean predictor:\n{table}\n",
              flush=True)
    tm = timing if timing else None
    if tm and tm["steps"]:
        print(f"[est.train] {tm['time'] / tm['steps'] * 1000:.1f} ms/step, {tm['samples'] / max(tm['time'], 1e-9):.1f} samples/s, "
              f"data wait {100 * tm['wait'] / max(tm['time'], 1e-9):.1f}% of the time")
    if plots and results:
        try:
            plot_learning_curve(os.path.join(run_dir, "metrics.csv"), os.path.join(run_dir, "learning_curve.png"),
                                monitor, units=task.units.get(monitor, ""))
            split = "test" if "test" in preds else next(iter(preds))
            plot_parity(parity_pairs(task, preds[split]), os.path.join(run_dir, f"parity_{split}.png"))
        except Exception as exc:  # plots must never kill a finished run
            warnings.warn(f"plotting failed: {exc}")
    # last: its presence (naming this step) is what makes the run finished
    write_json_atomic({"step": step, "best": best, "results": results, "timing": timing},
                      os.path.join(run_dir, "final_metrics.json"))
