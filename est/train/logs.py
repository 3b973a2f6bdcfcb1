"""Run-folder outputs: metrics CSV, optional TensorBoard, learning-curve and parity PNGs, summary table."""
from __future__ import annotations

import csv
import math
import os
from typing import Dict, Iterable, List, Optional, Sequence

import numpy as np

__all__ = ["MetricsCSV", "TensorBoard", "plot_learning_curve", "plot_parity", "summary_table"]


class MetricsCSV:
    """``metrics.csv``: one row per log / evaluation, fixed columns.

    On resume, rows written after the checkpoint's step (by the run that was
    interrupted) are dropped, so the file matches an uninterrupted run.
    """

    BASE = ["step", "epoch", "split", "lr", "loss", "samples_per_s", "step_s", "data_wait"]

    def __init__(self, path: str, metric_names: Sequence[str], *, resume_step: Optional[int] = None):
        self.path = path
        extra = [m for m in metric_names if m != "loss"]
        self.columns = self.BASE + extra + ["base_" + m for m in metric_names]
        rows: List[Dict[str, str]] = []
        if resume_step is not None and os.path.isfile(path):
            with open(path, newline="") as f:
                rows = [r for r in csv.DictReader(f) if r.get("step") and int(float(r["step"])) <= resume_step]
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._rewrite(rows)

    def _rewrite(self, rows: List[Dict[str, str]]) -> None:
        with open(self.path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=self.columns, extrasaction="ignore")
            w.writeheader()
            for r in rows:
                w.writerow(r)

    def drop_rows(self, predicate) -> None:
        """Remove the rows for which ``predicate(row)`` is true (e.g. those of an interrupted final evaluation)."""
        rows = _read(self.path) if os.path.isfile(self.path) else []
        self._rewrite([r for r in rows if not predicate(r)])

    def write(self, row: Dict[str, object]) -> None:
        with open(self.path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=self.columns, extrasaction="ignore")
            w.writerow({k: (f"{v:.8g}" if isinstance(v, float) else v) for k, v in row.items()})


class TensorBoard:
    """SummaryWriter when ``tensorboard`` is installed; otherwise a no-op."""

    def __init__(self, folder: str, enabled: bool = True):
        self.writer = None
        if enabled:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.writer = SummaryWriter(folder)
            except Exception:
                self.writer = None

    def log(self, split: str, values: Dict[str, float], step: int) -> None:
        if self.writer is None:
            return
        for k, v in values.items():
            if isinstance(v, (int, float)) and math.isfinite(float(v)):
                self.writer.add_scalar(f"{split}/{k}", float(v), step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _read(path: str) -> List[Dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _col(rows, key):
    out = []
    for r in rows:
        v = r.get(key, "")
        out.append(float(v) if v not in ("", None) else np.nan)
    return np.asarray(out)


def plot_learning_curve(csv_path: str, png_path: str, monitor: str, *, units: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _read(csv_path)
    tr = [r for r in rows if r["split"] == "train"]
    va = [r for r in rows if r["split"] == "val"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    ax = axes[0]
    if tr:
        ax.plot(_col(tr, "step"), _col(tr, "loss"), label="train loss")
    if va:
        ax.plot(_col(va, "step"), _col(va, "loss"), "o-", label="val loss (EMA)")
        base = _col(va, "base_loss")
        if np.isfinite(base).any():
            ax.axhline(np.nanmean(base), ls="--", c="gray", label="val mean predictor")
    ax.set_xlabel("step"); ax.set_ylabel("loss"); ax.set_yscale("log"); ax.legend(); ax.grid(alpha=0.3)
    ax = axes[1]
    if va and monitor in va[0]:
        ax.plot(_col(va, "step"), _col(va, monitor), "o-", label=f"val {monitor} (EMA)")
        base = _col(va, "base_" + monitor)
        if np.isfinite(base).any():
            ax.axhline(np.nanmean(base), ls="--", c="gray", label="mean predictor")
        ax.set_yscale("log")
    ax.set_xlabel("step"); ax.set_ylabel(f"{monitor} {units}".strip()); ax.legend(); ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)


def plot_parity(pairs: Dict[str, tuple], png_path: str, *, max_points: int = 20000) -> None:
    """``pairs``: title -> (true, pred) arrays."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(1, len(pairs))
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 4), squeeze=False)
    rng = np.random.default_rng(0)
    for ax, (title, (t, p)) in zip(axes[0], pairs.items()):
        t, p = np.asarray(t).reshape(-1), np.asarray(p).reshape(-1)
        if t.size > max_points:
            sel = rng.choice(t.size, max_points, replace=False)
            t, p = t[sel], p[sel]
        ax.scatter(t, p, s=3, alpha=0.4)
        if t.size:
            lo, hi = float(min(t.min(), p.min())), float(max(t.max(), p.max()))
            ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
            ax.set_title(f"{title}  (MAE {np.abs(t - p).mean():.4g})")
        ax.set_xlabel("true"); ax.set_ylabel("predicted")
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)


def summary_table(results: Dict[str, Dict[str, float]], names: Sequence[str], units: Dict[str, str]) -> str:
    """Rows: metric; columns per split: model (EMA, best) and mean predictor."""
    splits = list(results)
    head = ["metric"] + [f"{s}: model" for s in splits] + [f"{s}: mean predictor" for s in splits]
    lines = []
    for m in names:
        u = units.get(m, "")
        row = [f"{m} [{u}]" if u else m]
        row += [f"{results[s].get(m, float('nan')):.5g}" for s in splits]
        row += [f"{results[s].get('base_' + m, float('nan')):.5g}" for s in splits]
        lines.append(row)
    widths = [max(len(str(r[i])) for r in [head] + lines) for i in range(len(head))]
    fmt = lambda r: " | ".join(str(c).ljust(w) for c, w in zip(r, widths))
    sep = "-+-".join("-" * w for w in widths)
    return "\n".join([fmt(head), sep] + [fmt(r) for r in lines])
