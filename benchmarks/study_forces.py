#!/usr/bin/env python
r"""Forces where angles matter: est's EquiformerV2 vs EST vs MACE on GFN2-xTB molecular dynamics frames.

Data (``python -m est.data.xtb``, issue 17): per molecule, 2,000 training and
500 test frames of Langevin MD at 500 K labelled with GFN2-xTB total energies
(eV) and forces (eV/A), OC20-layout LMDB folders ``DATA/<molecule>/{train,test}``
plus the GFN2-xTB minimum ``DATA/<molecule>/relaxed.npz``. Every model sees the
same frames: the last ``val_frames`` (100) of the training trajectory are held
out for validation (learning curves, checkpoint choice), the rest is training,
the whole test trajectory is the test set. (The ``mixed`` split is not used: the
S2EF trainer normalises all energies with one mean and std, without per-element
references, which molecules hundreds of eV apart do not survive.)

Models (est models: the ``eqv2-tiny`` shape, 2 layers, L = 3, m = 2, 32
channels, cutoff 5 A, every neighbour, no periodic images, conservative forces
``F = -dE/dx`` with the polynomial envelope, so the energy is smooth for MD):

* ``est-ffn``      est's EquiformerV2 (``update="ffn"``), the reference row,
* ``est-default``  the EST block, default preset (on main: the spherical
  Transformer only, linear maps on the irreps, attention logits bounded by 4;
  the issue's "spherical experts only" row is this model, so it is not run twice),
* ``est-paper``    the EST paper's module preset,
* ``est-half``     ``est-default`` at half the width (channels, attention and
  feed-forward hidden channels halved): the paper's "small EST beats larger models",
* ``est-uncapped`` ``est-default`` without the bound (``model.est.logit_cap=0``; the
  default before v2): trained logits sharpen and alias on the degree-16 design;
  ``est-half-uncapped`` the same at half width. (Their seed-0 runs were made as
  ``est-default`` / ``est-half``; the default's seed 0 as ``est-capped``.)
* ``mace``         MACE 0.3.16 (``benchmarks/baseline/mace_baseline.py``, its own
  venv and training entry point: 2 layers, 64 channels, L = 2, correlation 3,
  r_max 5 A, its loss weights, float64), on the same frames and batch size.

Budget, two ways: equal optimisation steps (1,500 steps of 16 frames, 5x
``study_accuracy.py``'s 225 ... 316; MACE counts whole epochs, so it runs up to
one epoch more) and equal time on one thread: every model records its learning
curve, validation force MAE vs steps and vs seconds of optimisation
(evaluations and start-up excluded), and the equal-time table reads two
curves at the same second T = the shorter of the two runs (linear
interpolation between evaluations). Runs made at different times see a
different load on a shared machine (CPU seconds per step of one run moved by
1.5x with the number of other jobs), so the default clock is the **step cost**:
each est model's optimisation step (``Trainer.train_step`` on the same
batches, one thread) is timed round-robin with the others in one process
(:func:`calibrate`, ``ROOT/<molecule>/step_costs.json``, also recorded in
``forces.json`` as ``step_costs``, which a root without the file starts from;
median CPU seconds of 7 rounds after 2 warm-up), and a curve's time is steps
x that cost. MACE
runs in its own environment and cannot be interleaved: right after the est
models it is timed by a short ``run_train`` of the study's config on the first
frames (:func:`mace_step_cost`: the median of MACE's own per-step times after
warm-up, same batch size, one thread), so a quiet machine during
``--calibrate`` makes its cost comparable; without that timing (no venv) its
cost is its own run's CPU seconds per step, which carry that run's load.
``--clock cpu``
/ ``wall`` use each run's own CPU / wall seconds instead. The learning-rate schedule
follows the step budget, so a curve read before its end is mid-schedule: the
faster model of a pair is compared at the end of its schedule. A
``<model>@time`` run (``--models est-default@time``) removes that asymmetry:
``<model>`` trained for the steps that cost what est-ffn's 1,500 cost (steps x
step cost, :func:`time_budget`, fixed in the run folder at its start), its
warm-up and schedule ending there, then measured like every run. Its ratio to
est-ffn on the test set (paired by seed) is the equal-time reading at the end
of both schedules; the ``-time`` table adds it to the issue's target line.

Metrics on the test set (best-validation EMA weights; one definition for est
and MACE, ``mace_baseline.force_metrics``): energy MAE (meV/atom), force MAE
(meV/A), force cosine, and each test frame's force MAE, so that two models
are compared frame by frame: per seed, the ratio to est-ffn with a 90%
interval from a paired block bootstrap over the test trajectory
(:func:`frame_ratio`) and both models' MAE along it (:func:`frames_table`;
``--refresh-metrics`` gives finished runs recorded before the per-frame errors
their test metrics again from their checkpoints). est models also get the rotation error of the trained
forces in float64 (``est.testing.check_model``, a test frame). NVE MD
(``mace_baseline.nve_md``, velocity Verlet, 0.5 fs, float64) from the GFN2-xTB
minimum with 300 K Maxwell-Boltzmann velocities (MD seed = run seed) through
``ESTCalculator`` or MACE's calculator, ``--md-ps`` long (10 ps): energy drift
(slope of E_total, meV/atom/ps) and intact (no bond ever > 1.5x its length at
the minimum).

Tables (``tables``, also rendered by ``summary.py`` into ``<!-- summary:forces-<molecule> -->``
and ``forces-<molecule>-time``): per molecule, models x metrics, mean ± sd
over seeds, per-seed ratios to est's EquiformerV2 and to MACE (paired by seed);
the issue's target is EST default force MAE <= 0.90x EquiformerV2 at equal time.
Plots: ``benchmarks/results/plots/forces_<molecule>.png`` (curves vs steps and
vs seconds, one line per seed).

Each (molecule, model, seed) is one subprocess with one thread, ``--jobs`` at
a time, in ``ROOT/<molecule>/<model>-s<seed>/``; it resumes a killed run
(est: the trainer's ``last.pt`` and ``curve.jsonl``; MACE: its own checkpoint;
test metrics, equivariance and MD are kept in their own JSON files; the MD
saves its trajectory state every 1,000 steps in ``md_state.json``) and is
skipped once ``result.json`` exists (delete the folder to rerun it). The
budget of a root is fixed by its first call (``ROOT/budget.json``).

    python benchmarks/study_forces.py --data-dir DATA                 # 4 molecules x 5 models x 3 seeds
    python benchmarks/study_forces.py --data-dir DATA --molecules ethanol --models est-ffn est-default --seeds 0
    python benchmarks/study_forces.py --data-dir DATA --quick --molecules ethanol   # smoke run (ROOT/quick), with
                                                                      # the projected CPU hours of the full runs
    python benchmarks/study_forces.py --tables-only                   # tables and plots from the stored runs
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "baseline"))

import common  # noqa: E402
from common import markdown_table, mean_sd, paired  # noqa: E402
import mace_baseline as mb  # noqa: E402

MOLECULES = ("ethanol", "malonaldehyde", "aspirin", "paracetamol")
#: every est model: the shape and the physics (conservative forces, smooth cutoff, isolated molecules)
SHAPE = ["model=eqv2_tiny", "model.regress_forces=gradient", "model.envelope=polynomial", "model.max_neighbors=null",
         "model.use_pbc=false", "model.cutoff=5.0", "model.avg_num_nodes=auto", "model.avg_degree=auto"]
#: eqv2-tiny's widths halved (32 -> 16 channels and attention hidden channels, 64 -> 32 feed-forward hidden)
HALF = ["model.channels=16", "model.attn_hidden_channels=16", "model.ffn_hidden_channels=32"]
MACE = "mace"
#: model label -> overrides on top of SHAPE (``mace``: the MACE baseline, no overrides)
MODELS: dict[str, list[str]] = {
    "est-ffn": ["model.update=ffn"],
    "est-default": ["model.update=est", "model.est.preset=default"],
    "est-paper": ["model.update=est", "model.est.preset=paper"],
    "est-half": ["model.update=est", "model.est.preset=default", *HALF],
    "est-uncapped": common.EST_UNCAPPED,  # the default without its bound on the attention logits
    "est-half-uncapped": [*common.EST_UNCAPPED, *HALF],
    # the default on a degree-14 design (114 points instead of 146): a trained t = 16 model loses nothing
    # on it (bench_trained_grid.py); does one trained on it, at ~0.8x the attention's points?
    "est-t14": ["model.update=est", "model.est.preset=default", "model.est.grid.degree=14"],
    MACE: [],
}
LABELS = {"est-ffn": "est EquiformerV2 (`update=\"ffn\"`)", "est-default": "est EST default (spherical Transformer only)",
          "est-paper": "est EST (paper preset)", "est-half": "est EST default, half width",
          "est-uncapped": f"est {common.EST_UNCAPPED_LABEL}",
          "est-half-uncapped": "est EST default, uncapped, half width",
          "est-t14": "est EST default on a degree-14 design (S = 114)",
          MACE: "MACE (L=2, 64 ch)"}
#: models run only when named (--models): the default without its logit bound, the default on a coarser design
ABLATIONS = ("est-uncapped", "est-half-uncapped", "est-t14")
REFERENCE = "est-ffn"
#: ``<model>@time``: ``<model>`` trained for as many steps as fit in est-ffn's time (its 1,500 steps x its step
#: cost), its schedule ending there (:func:`time_budget`): the equal-time reading on the test set
TIME_SUFFIX = "@time"
#: --models choices: every model, and every est model but the reference in EquiformerV2's time
MODEL_CHOICES = [*MODELS, *(m + TIME_SUFFIX for m in MODELS if m not in (MACE, REFERENCE))]
#: per run folder: the NVE trajectory's state while it runs (``mace_baseline.nve_md(checkpoint=...)``; resumable)
MD_STATE = "md_state.json"
#: issue 17: EST default force MAE <= 0.90x est's EquiformerV2 at equal time (paired seeds)
TARGET = ("est-default", 0.90)
#: --clock -> the curve key holding that clock's seconds ("step-cost": steps x the model's interleaved step cost)
CLOCKS = {"step-cost": "cost_seconds", "cpu": "cpu_seconds", "wall": "seconds"}
CLOCK_WORDS = {"step-cost": "steps x each model's step time on one thread, the est models timed round-robin, "
                            "MACE right after",
               "cpu": "each run's own CPU seconds", "wall": "each run's own wall seconds"}
CURVE_KEY = "forces_mae_meV_A"
#: frames per block of the paired bootstrap over the test trajectory (:func:`frame_ratio`), and per shown stretch
FRAME_BLOCK, SHOW_BLOCK = 25, 100


@dataclass(kw_only=True, frozen=True)
class Budget:
    """Data, training and MD budget of one run (identical for every model of a root)."""

    steps: int = 1500
    batch_size: int = 16
    eval_every: int = 50
    #: validation frames: the last ones of the training trajectory
    val_frames: int = 100
    #: training frames (the first ones); None: all but the validation frames
    train_frames: int | None = None
    #: test frames (the first ones); None: all
    test_frames: int | None = None
    md_ps: float = 10.0
    md_timestep_fs: float = 0.5
    md_temperature_K: float = 300.0

    @property
    def md_steps(self) -> int:
        return int(round(1000.0 * self.md_ps / self.md_timestep_fs))

    @property
    def md_every(self) -> int:
        """Record the MD energy every this many steps (at most about 2,000 records)."""
        return max(1, self.md_steps // 2000)


FULL = Budget()
QUICK = Budget(steps=12, eval_every=4, val_frames=16, train_frames=48, test_frames=32, md_ps=0.1)


def split_indices(n_train_file: int, budget: Budget) -> tuple[list[int], list[int]]:
    """(training, validation) indices into the training trajectory: validation is its last ``val_frames``."""
    n_val = budget.val_frames
    n_train = n_train_file - n_val if budget.train_frames is None else budget.train_frames
    if n_val < 1 or n_train < budget.batch_size or n_train + n_val > n_train_file:
        raise ValueError(f"{n_train_file} training frames cannot hold {n_train} for training (at least one batch of "
                         f"{budget.batch_size}) and {n_val} for validation. Fix: lower train_frames / val_frames")
    return list(range(n_train)), list(range(n_train_file - n_val, n_train_file))


def base_model(model: str) -> str:
    """The model a run trains: ``est-default@time`` -> ``est-default``."""
    return model.removesuffix(TIME_SUFFIX)


def is_timed(model: str) -> bool:
    return model.endswith(TIME_SUFFIX)


def label(model: str) -> str:
    """Table label: the model's, plus "in EquiformerV2's time" for a ``@time`` run."""
    base = LABELS.get(base_model(model), base_model(model))
    return f"{base}, trained in EquiformerV2's time" if is_timed(model) else base


def timed_steps(costs: dict[str, dict[str, Any]], model: str, budget: Budget) -> int:
    r"""Steps of ``model`` that cost what ``budget.steps`` of est-ffn cost:
    :math:`\mathrm{round}(n\,c_\mathrm{ffn} / c_\mathrm{model})` with the step costs ``c`` (CPU seconds)."""
    return max(1, round(budget.steps * costs[REFERENCE]["cpu_s"] / costs[base_model(model)]["cpu_s"]))


def run_dir(root: Path, molecule: str, model: str, seed: int) -> Path:
    return Path(root) / molecule / f"{model}-s{seed}"


def cached(path: Path, compute: Callable[[], Any], *, require: str | None = None) -> Any:
    """``compute()``, kept in ``path`` (JSON) so that a rerun of the job reuses it; a stored value without the
    key ``require`` (written before that key existed) is computed again."""
    if path.exists():
        value = json.loads(path.read_text())
        if require is None or require in value:
            return value
    value = compute()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=1, default=float))
    os.replace(tmp, path)
    return value


# ------------------------------------------------------------------ curves (pure)
def curve_end(curve: list[dict], clock: str) -> float:
    """Seconds of a curve's last point (nan for an empty curve)."""
    return float(curve[-1][CLOCKS[clock]]) if curve else math.nan


def curve_value(curve: list[dict], t: float, *, clock: str = "cpu", key: str = CURVE_KEY) -> float:
    """``key`` at ``t`` seconds of ``clock``: linear between evaluations; nan outside the curve."""
    if not curve or math.isnan(t):
        return math.nan
    xs = np.array([p[CLOCKS[clock]] for p in curve], dtype=float)
    ys = np.array([p[key] for p in curve], dtype=float)
    eps = 1e-9 * max(1.0, abs(xs[-1]))
    if t < xs[0] - eps or t > xs[-1] + eps:
        return math.nan
    return float(np.interp(t, xs, ys))


def read_at(rec: dict, t: float, clock: str = "cpu") -> dict:
    """``{"T", "value", "steps"}``: a run's validation force MAE and step count at ``t`` seconds."""
    return {"T": t, "value": curve_value(rec["curve"], t, clock=clock), "steps": curve_value(rec["curve"], t, clock=clock, key="step")}


def equal_time(recs: list[dict], base: list[dict], *, clock: str = "cpu") -> list[dict]:
    """Per seed both have: ``read_at`` T = the earlier of the two curves' ends, plus ``"seed"``, ``"base"``, ``"ratio"``."""
    by_seed = {b["seed"]: b for b in base}
    out = []
    for r in sorted(recs, key=lambda r: r["seed"]):
        b = by_seed.get(r["seed"])
        if b is None:
            continue
        t = min(curve_end(r["curve"], clock), curve_end(b["curve"], clock))
        at, vb = read_at(r, t, clock), curve_value(b["curve"], t, clock=clock)
        out.append(at | {"seed": r["seed"], "base": vb, "ratio": at["value"] / vb if vb > 0 else math.nan})
    return out


def _step_ms(recs: list[dict]) -> str:
    """Milliseconds per optimisation step: the calibrated step cost (one number per model), else (no venv
    or no data to time on) the mean of the runs' own CPU ms/step, marked ``own runs``."""
    if recs[0].get("step_cost_source", "own run") != "own run":
        return f"{1000.0 * recs[0]['step_cost_s']:.0f}"
    return mean_sd([r["cpu_ms_per_step"] for r in recs]) + " (own runs)"


def _ratios(ratios: list[float]) -> str:
    """``0.91 0.85 (2/2 lower)``; ``-`` for none, ``n/a`` for a ratio that could not be read (a curve not started at T)."""
    if not ratios:
        return "-"
    shown = " ".join("n/a" if math.isnan(x) else f"{x:.2f}" for x in ratios)
    read = [x for x in ratios if not math.isnan(x)]
    return f"{shown} {_lower(read)}" if read else shown


def _lower(read: list[float]) -> str:
    """``(2/3 lower)``: how many of the (read, not nan) ratios are below 1."""
    return f"({sum(x < 1 for x in read)}/{len(read)} lower)"


# ------------------------------------------------------------------ tables and plots (pure)
def frame_ratio(errors: list[float], base: list[float], *, block: int = FRAME_BLOCK, draws: int = 2000,
                level: float = 0.90, seed: int = 0) -> tuple[float, float, float]:
    r"""``(ratio, lo, hi)``: the test force MAE ratio :math:`\sum_f e_f / \sum_f b_f` of two models on the same
    frames (per-frame MAEs ``errors`` and ``base``, [F], equal atoms per frame, so this is the ratio of the
    MAEs) and its ``level`` interval from a paired block bootstrap: the trajectory cut into consecutive
    blocks of ``block`` frames (MD frames are correlated), as many blocks drawn with replacement, the same
    draw for both models, ``draws`` times (percentiles)."""
    e, b = np.asarray(errors, dtype=float), np.asarray(base, dtype=float)  # [F]
    if e.shape != b.shape or e.ndim != 1 or not len(e):
        raise ValueError(f"per-frame errors of different frames: {e.shape} vs {b.shape}")
    es = np.array([x.sum() for x in _blocks(e, block)])  # [B] block sums
    bs = np.array([x.sum() for x in _blocks(b, block)])  # [B]
    pick = np.random.default_rng(seed).integers(0, len(es), size=(draws, len(es)))  # [draws, B]
    ratios = es[pick].sum(1) / bs[pick].sum(1)  # [draws]
    lo, hi = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2])
    return float(e.sum() / b.sum()), float(lo), float(hi)


def _blocks(x: np.ndarray, size: int) -> list[np.ndarray]:
    """``x`` cut into consecutive pieces of ``size`` (the last may be shorter)."""
    return np.split(x, np.arange(size, len(x), size))


def block_means(errors: list[float], size: int = SHOW_BLOCK) -> list[float]:
    """Mean of each consecutive ``size`` frames (the last block may be shorter)."""
    return [float(x.mean()) for x in _blocks(np.asarray(errors, dtype=float), size)]


def frames_table(per_model: dict[str, list[dict]]) -> str:
    """Per model and seed with per-frame test errors for it and est-ffn (``mace_baseline.FRAMES_KEY``): the
    test force MAE ratio with its 90% paired block-bootstrap interval (:func:`frame_ratio`), and both models'
    MAE per ``SHOW_BLOCK`` consecutive test frames; empty when no pair has them."""
    ref = {r["seed"]: r["metrics"].get(mb.FRAMES_KEY) for r in per_model.get(REFERENCE, [])}
    rows = []
    for model in (m for m in _order(per_model) if m != REFERENCE):
        for r in sorted(per_model[model], key=lambda r: r["seed"]):
            mine, base = r["metrics"].get(mb.FRAMES_KEY), ref.get(r["seed"])
            if not mine or not base or len(mine) != len(base):
                continue
            ratio, lo, hi = frame_ratio(mine, base)
            rows.append({"model": label(model), "seed": r["seed"], "forces / EquiformerV2": f"{ratio:.3f}",
                         "90% interval": f"{lo:.3f} - {hi:.3f}",
                         f"per {SHOW_BLOCK} frames (meV/A)": " / ".join(f"{x:.1f}" for x in block_means(mine)),
                         f"EquiformerV2 per {SHOW_BLOCK} frames": " / ".join(f"{x:.1f}" for x in block_means(base))})
    if not rows:
        return ""
    return markdown_table(rows, list(rows[0])) + (
        f"\n\nTest force MAE ratio per seed with a 90% interval from a paired bootstrap over blocks of {FRAME_BLOCK} "
        f"consecutive test frames (the same blocks drawn for both models), and each model's MAE on consecutive "
        f"{SHOW_BLOCK}-frame stretches of the test trajectory.")


def _verdict(ratios: list[float], bound: float) -> str:
    """``per seed 1.10 1.05, mean 1.08, 0/2 seeds within: not met.`` (met: the mean ratio <= ``bound``)."""
    mean = statistics.fmean(ratios)
    return (f"per seed {' '.join(f'{x:.2f}' for x in ratios)}, mean {mean:.2f}, "
            f"{sum(x <= bound for x in ratios)}/{len(ratios)} seeds within: {'met' if mean <= bound else 'not met'}.")


def _order(per_model: dict[str, list[dict]]) -> list[str]:
    """Models in ``MODELS``' order, each ``@time`` run after its model, then any others."""
    known = [x for m in MODELS for x in (m, m + TIME_SUFFIX)]
    return [m for m in known if m in per_model] + [m for m in per_model if m not in known]


def tables(results: dict[str, dict[str, list[dict]]], *, clock: str = "cpu") -> dict[str, str]:
    """``forces-<molecule>`` (test metrics at equal steps, MD, equivariance) and
    ``forces-<molecule>-time`` (validation force MAE at equal time, the issue's target)."""
    out: dict[str, str] = {}
    for molecule, per_model in results.items():
        ref, mace = per_model.get(REFERENCE), per_model.get(MACE)
        steps_rows, time_rows = [], []
        for model in _order(per_model):
            recs = sorted(per_model[model], key=lambda r: r["seed"])
            met = [r["metrics"] for r in recs]
            eq = [r["equivariance"][k] for r in recs if r.get("equivariance") for k in r["equivariance"] if k != "output"]
            md = [r["md"] for r in recs if r.get("md")]
            row = {"model": label(model), "params": f"{recs[0]['params']:,}" if recs[0].get("params") else "-",
                   "seeds": len(recs),
                   "energy (meV/atom)": mean_sd([m["energy_mae_meV_atom"] for m in met]),
                   "forces (meV/A)": mean_sd([m["forces_mae_meV_A"] for m in met]),
                   "force cos": mean_sd([m["forces_cos"] for m in met]),
                   "forces / EquiformerV2": "" if model == REFERENCE or not ref else _ratios(paired(recs, ref, "forces_mae_meV_A")[0]),
                   "forces / MACE": "" if model == MACE or not mace else _ratios(paired(recs, mace, "forces_mae_meV_A")[0]),
                   "ms/step": _step_ms(recs),
                   "rot. error (max)": f"{max(eq):.1e}" if eq else "-",
                   "abs NVE drift (meV/atom/ps)": mean_sd([abs(d["drift_meV_atom_ps"]) for d in md]),
                   "intact": f"{sum(bool(d['intact']) for d in md)}/{len(md)}" if md else "-"}
            steps_rows.append(row)
            # each row at the time it and EquiformerV2 both reached (per seed); the reference row at its own end
            vs_ref = equal_time(recs, ref, clock=clock) if ref and model != REFERENCE else []
            at = vs_ref or [read_at(r, curve_end(r["curve"], clock), clock) for r in recs]
            time_rows.append({
                "model": label(model), "seeds": len(recs), "T (s)": mean_sd([a["T"] for a in at]),
                "steps at T": mean_sd([a["steps"] for a in at]),
                "val forces at T (meV/A)": mean_sd([a["value"] for a in at]),
                "/ EquiformerV2 at T": _ratios([a["ratio"] for a in vs_ref]),
                "/ MACE at T": "" if model == MACE or not mace else _ratios([a["ratio"] for a in equal_time(recs, mace, clock=clock)]),
            })
        frames = frames_table(per_model)
        out[f"forces-{molecule}"] = markdown_table(steps_rows, list(steps_rows[0])) + (f"\n\n{frames}" if frames else "")
        text = markdown_table(time_rows, list(time_rows[0])) + (
            f"\n\nValidation force MAE read off the learning curves at T seconds of optimisation ({CLOCK_WORDS[clock]}): "
            "per seed, T is the end of the shorter of the row's run and EquiformerV2's (EquiformerV2's row: its own end); "
            "the MACE ratio is read at the shorter of the row's run and MACE's; n/a: a curve with no evaluation by then.")
        target, bound = TARGET
        if ref and target in per_model:
            pairs = equal_time(per_model[target], ref, clock=clock)
            ratios = [p["ratio"] for p in pairs if not math.isnan(p["ratio"])]
            if ratios:
                text += (f"\n\nTarget (issue 17): {target} / {REFERENCE} force MAE at equal time ({clock} clock) <= {bound:.2f}: "
                         + _verdict(ratios, bound))
        timed = per_model.get(target + TIME_SUFFIX)
        if ref and timed:
            ratios, _ = paired(timed, ref, "forces_mae_meV_A")
            if ratios:
                steps = sorted({r["steps"] for r in timed})
                text += (f"\n\nThe same target on the test set, {target} trained to the end of its own schedule in "
                         f"{REFERENCE}'s time ({'/'.join(map(str, steps))} steps, `{target}{TIME_SUFFIX}`): "
                         + _verdict(ratios, bound))
        out[f"forces-{molecule}-time"] = text
    if any(REFERENCE in per_model for per_model in results.values()):
        out["forces-overview"] = overview(results, clock=clock)
    return out


def _mean_of_ratios(ratios: list[float]) -> str:
    """``1.06 (0/3 lower)``: the mean of the per-seed ratios (nan dropped) and how many are below 1; empty for none."""
    read = [x for x in ratios if not math.isnan(x)]
    return f"{statistics.fmean(read):.2f} {_lower(read)}" if read else ""


def overview(results: dict[str, dict[str, list[dict]]], *, clock: str = "cpu") -> str:
    r"""Every model against est's EquiformerV2 on every molecule, two columns per molecule:

    * equal steps: :math:`\frac1n\sum_s F_{model,s} / F_{ref,s}`, the test force MAE ratio over the n paired seeds;
    * equal time: the same mean of the validation force MAE ratios read off the learning curves at the shorter of
      the two runs (:func:`equal_time`, ``clock`` seconds).

    A molecule without an EquiformerV2 row has no columns; a model without runs on a molecule, empty cells."""
    molecules = [m for m, per_model in results.items() if REFERENCE in per_model]
    models = _order({model: [] for m in molecules for model in results[m]})
    rows = []
    for model in (m for m in models if m != REFERENCE):
        row = {"model": label(model)}
        for molecule in molecules:
            recs, ref = results[molecule].get(model, []), results[molecule][REFERENCE]
            row[f"{molecule}: equal steps"] = _mean_of_ratios(paired(recs, ref, "forces_mae_meV_A")[0])
            row[f"{molecule}: equal time"] = _mean_of_ratios([p["ratio"] for p in equal_time(recs, ref, clock=clock)])
        rows.append(row)
    cols = ["model"] + [f"{m}: {k}" for m in molecules for k in ("equal steps", "equal time")]
    return markdown_table(rows, cols) + (
        "\n\nForce MAE / est's EquiformerV2's (`update=\"ffn\"`), mean over paired seeds (how many seeds below 1): "
        f"test set at equal steps; validation curves at equal time ({CLOCK_WORDS[clock]}).")


def plot_curves(results: dict[str, dict[str, list[dict]]], plots: Path, *, clock: str = "cpu") -> list[Path]:
    """One PNG per molecule: validation force MAE vs steps and vs seconds, one line per (model, seed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots.mkdir(parents=True, exist_ok=True)
    written = []
    for molecule, per_model in results.items():
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
        for i, model in enumerate(_order(per_model)):
            for j, r in enumerate(sorted(per_model[model], key=lambda r: r["seed"])):
                c = r["curve"]
                if not c:
                    continue
                y = [p[CURVE_KEY] for p in c]
                kw = dict(color=f"C{i}", lw=1.2, alpha=0.8, label=label(model) if j == 0 else None)
                axes[0].plot([p["step"] for p in c], y, **kw)
                axes[1].plot([p[CLOCKS[clock]] for p in c], y, **kw)
        for ax, xlabel in zip(axes, ("optimisation steps", f"optimisation seconds ({clock} clock)")):
            ax.set_xlabel(xlabel)
            ax.set_ylabel("validation force MAE (meV/A)")
            ax.set_yscale("log")
            ax.grid(alpha=0.3, which="both")
        axes[0].legend(fontsize=7)
        fig.suptitle(f"{molecule} (GFN2-xTB): learning curves, one line per seed", fontsize=10)
        fig.tight_layout()
        path = plots / f"forces_{molecule}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def projection(results: dict[str, dict[str, list[dict]]], budget: Budget, *, test_frames: int = 500) -> str:
    """Projected CPU hours of one run at ``budget`` from the measured CPU cost of a training step (steady,
    between the first and last evaluations), an MD step and a test frame (validation and test passes)."""
    rows = []
    for molecule, per_model in results.items():
        for model in _order(per_model):
            for r in per_model[model]:
                train_h = budget.steps * r["cpu_ms_per_step_steady"] / 3.6e6
                md_ms = r["md"]["cpu_ms_per_step"]
                md_h = budget.md_steps * md_ms / 3.6e6
                frames = budget.steps // budget.eval_every * budget.val_frames + test_frames
                eval_h = frames * r["metrics"]["cpu_s"] / r["metrics"]["frames"] / 3600.0
                rows.append({"molecule": molecule, "model": model, "seed": r["seed"],
                             "train CPU ms/step": f"{r['cpu_ms_per_step_steady']:.0f}", "MD CPU ms/step": f"{md_ms:.1f}",
                             f"train h ({budget.steps} steps)": f"{train_h:.2f}", f"MD h ({budget.md_ps:g} ps)": f"{md_h:.2f}",
                             f"evaluation h ({frames} frames)": f"{eval_h:.2f}", "run h": f"{train_h + md_h + eval_h:.2f}"})
    return markdown_table(rows, list(rows[0])) if rows else ""


# ------------------------------------------------------------------ data
def molecule_dir(data_dir: Path, molecule: str) -> Path:
    d = Path(data_dir) / molecule
    missing = [p for p in (d / "train", d / "test", d / "relaxed.npz") if not p.exists()]
    if missing:
        raise FileNotFoundError(f"{', '.join(map(str, missing))} missing. Fix: generate the set with "
                                f"`python -m est.data.xtb --out {data_dir} --molecules {molecule}` or pass --data-dir")
    return d


def relaxed_atoms(data_dir: Path, molecule: str):
    """The GFN2-xTB minimum of ``molecule`` (no cell, not periodic): the MD start and the bond reference."""
    from ase import Atoms

    d = np.load(molecule_dir(data_dir, molecule) / "relaxed.npz")
    atoms = Atoms(numbers=d["numbers"], positions=d["positions"], pbc=False)
    atoms.info[mb.ENERGY_KEY] = float(d["energy"])
    atoms.arrays[mb.FORCES_KEY] = np.asarray(d["forces"], dtype=float)
    return atoms


def est_datasets(data_dir: Path, molecule: str, budget: Budget) -> dict[str, Any]:
    from est.data import LmdbDataset
    from est.train.data import IndexSubset

    d = molecule_dir(data_dir, molecule)
    train_file, test_file = LmdbDataset(str(d / "train")), LmdbDataset(str(d / "test"))
    train, val = split_indices(len(train_file), budget)
    n_test = len(test_file) if budget.test_frames is None else min(budget.test_frames, len(test_file))
    return {"train": IndexSubset(train_file, train), "val": IndexSubset(train_file, val),
            "test": IndexSubset(test_file, range(n_test))}


def mace_files(data_dir: Path, molecule: str, root: Path, budget: Budget) -> dict[str, str]:
    """The same frames as extxyz for MACE (written once per root): train, valid, test, relaxed."""
    from ase.io import write

    d = molecule_dir(data_dir, molecule)
    out = Path(root) / "data" / molecule
    files = {k: str(out / f"{k}.xyz") for k in ("train", "valid", "test", "relaxed")}
    if all(Path(f).exists() for f in files.values()):
        return files
    from est.data import LmdbDataset

    train, val = split_indices(len(LmdbDataset(str(d / "train"))), budget)
    mb.export_xyz(d / "train", files["train"], limit=len(train))
    mb.export_xyz(d / "train", files["valid"], start=val[0], limit=len(val))
    mb.export_xyz(d / "test", files["test"], limit=budget.test_frames)
    write(files["relaxed"], relaxed_atoms(data_dir, molecule), format="extxyz")
    return files


# ------------------------------------------------------------------ one est run (subprocess)
def est_overrides(model: str, data_dir: Path, molecule: str, seed: int, rd: Path, budget: Budget, *,
                  steps: int | None = None) -> list[str]:
    """``python train.py`` overrides of one est run (the datasets themselves are passed to the trainer);
    ``steps``: the step budget (default ``budget.steps``), which the warm-up and the schedule follow."""
    d = Path(data_dir) / molecule
    steps = budget.steps if steps is None else steps
    return [*SHAPE, *MODELS[base_model(model)], "data=oc20_s2ef", f"data.train_path={d / 'train'}", f"data.val_path={d / 'train'}",
            f"data.test_path={d / 'test'}", f"data.batch_size={budget.batch_size}", "data.eval_batch_size=32",
            "data.num_workers=0", f"trainer.max_steps={steps}", "trainer.max_epochs=100000",
            f"trainer.warmup_steps={max(1, steps // 30)}", f"trainer.eval_every={budget.eval_every}",
            "trainer.lr=5e-4", "trainer.ema_decay=0.99", "trainer.energy_coefficient=2.0", "trainer.force_coefficient=100.0",
            "trainer.monitor=forces_mae", "trainer.final_splits=[]", f"trainer.log_every={budget.eval_every}",
            "trainer.resume=auto", "trainer.progress=false", "trainer.tensorboard=false", "trainer.plots=false",
            f"seed={seed}", f"run_dir={rd}", f"name=forces-{molecule}-{model}"]


class TrainingClock:
    """Optimisation seconds of an ``est.train.Trainer`` (wall and CPU), evaluations excluded.

    Wraps the trainer's public ``evaluate`` and ``on_step_end``: each validation
    evaluation adds a learning-curve point ``{"step", "seconds", "cpu_seconds",
    forces_mae_meV_A, energy_mae_meV_atom, forces_cos}`` timed when it starts;
    the time from there to the end of that step (evaluation, checkpoint writes)
    is not counted. Points are appended to ``path`` (JSON lines) as they come;
    a resumed trainer keeps the points up to its step and continues the clock
    from the last one (steps after it, saved at an interruption, are counted at
    the mean rate so far).
    """

    def __init__(self, trainer, path: Path, natoms: int):
        self.trainer, self.path, self.natoms = trainer, Path(path), natoms
        old = [json.loads(x) for x in self.path.read_text().splitlines() if x.strip()] if self.path.exists() else []
        self.points = [p for p in old if p["step"] <= trainer.step]
        self.path.write_text("".join(json.dumps(p) + "\n" for p in self.points))
        self.offset = (0.0, 0.0)
        if self.points:
            last = self.points[-1]
            scale = trainer.step / last["step"]
            self.offset = (last["seconds"] * scale, last["cpu_seconds"] * scale)
        self._evaluate = trainer.evaluate
        trainer.evaluate = self._timed_evaluate
        trainer.on_step_end = self._step_end
        self._start = self._paused = None
        self.excluded = [0.0, 0.0]

    @staticmethod
    def _now() -> tuple[float, float]:
        return time.perf_counter(), time.process_time()

    def start(self) -> None:
        self._start = self._now()

    def elapsed(self) -> tuple[float, float]:
        """(wall, CPU) optimisation seconds so far."""
        now = self._paused or self._now()
        return tuple(self.offset[i] + now[i] - self._start[i] - self.excluded[i] for i in range(2))

    def _resume(self) -> None:
        if self._paused is not None:
            now = self._now()
            self.excluded = [self.excluded[i] + now[i] - self._paused[i] for i in range(2)]
            self._paused = None

    def _step_end(self, trainer) -> None:
        self._resume()

    def _timed_evaluate(self, split: str = "val", **kw):
        if split != "val" or kw.get("module") is not None or kw.get("collect") or self._start is None:
            return self._evaluate(split, **kw)
        wall, cpu = self.elapsed()
        self._paused = self._now()
        m = self._evaluate(split, **kw)
        point = {"step": self.trainer.step, "seconds": wall, "cpu_seconds": cpu,
                 "forces_mae_meV_A": 1000.0 * m["forces_mae"], "energy_mae_meV_atom": 1000.0 * m["energy_mae"] / self.natoms,
                 "forces_cos": m["forces_cos"]}
        self.points.append(point)
        with open(self.path, "a") as f:
            f.write(json.dumps(point) + "\n")
        return m

    def stop(self) -> tuple[float, float]:
        self._resume()
        return self.elapsed()


def steady_ms_per_step(curve: list[dict], key: str = "cpu_seconds") -> float:
    """Milliseconds per step between the first and the last curve point (start-up and first steps excluded)."""
    if len(curve) < 2:
        return 1000.0 * curve[-1][key] / curve[-1]["step"] if curve else math.nan
    return 1000.0 * (curve[-1][key] - curve[0][key]) / (curve[-1]["step"] - curve[0]["step"])


def calibrate(molecule: str, models: list[str], data_dir: Path, budget: Budget, *, rounds: int = 7,
              warmup: int = 2) -> dict[str, dict[str, float]]:
    """``{model: {"cpu_s", "wall_s"}}``: median seconds of one optimisation step of each est model, timed
    round-robin (every model once per round, the same training batch) in this process on one thread, so
    that the machine's load falls on all models alike and their ratio is fair."""
    import tempfile

    import torch

    from est.train import Trainer, load_config
    from est.train.data import make_loader

    torch.set_num_threads(1)
    datasets = est_datasets(data_dir, molecule, budget)
    times: dict[str, dict[str, list[float]]] = {m: {"cpu_s": [], "wall_s": []} for m in models}
    with tempfile.TemporaryDirectory() as tmp:
        trainers = {m: Trainer(load_config(est_overrides(m, data_dir, molecule, 0, Path(tmp) / m, budget)),
                               datasets=datasets) for m in models}
        first = trainers[models[0]]
        batches = iter(make_loader(first.train_ds, first.sampler))
        for r in range(warmup + rounds):
            batch = next(batches)
            for m, trainer in trainers.items():
                w0, c0 = time.perf_counter(), time.process_time()
                trainer.train_step(batch)
                if r >= warmup:
                    times[m]["wall_s"].append(time.perf_counter() - w0)
                    times[m]["cpu_s"].append(time.process_time() - c0)
    return {m: {k: statistics.median(v) for k, v in t.items()} | {"rounds": rounds} for m, t in times.items()}


def mace_step_cost(molecule: str, data_dir: Path, root: Path, budget: Budget, *, dtype: str = "float64",
                   steps: int = 12, warmup: int = 3) -> dict[str, Any]:
    """``{"cpu_s", "wall_s", "steps", "source"}``: seconds of one MACE optimisation step on one thread, the
    median of MACE's own per-step times (its results file) over ``steps`` steps after ``warmup``, from one
    epoch of ``run_train`` with the study's config and batch size on the first ``(warmup + steps) x batch``
    training frames, in a temporary folder (the study's runs are not touched). On one thread the step's
    wall time is its CPU time."""
    import tempfile

    files = mace_files(data_dir, molecule, root, budget)
    with tempfile.TemporaryDirectory() as tmp:
        sub = Path(tmp) / "train.xyz"
        mb.export_xyz(molecule_dir(data_dir, molecule) / "train", sub, limit=(warmup + steps) * budget.batch_size)
        cfg = mb.MaceTrainConfig(seed=0, epochs=1, threads=1, batch_size=budget.batch_size, default_dtype=dtype)
        mb.train(cfg, train_xyz=str(sub), test_xyz=None, valid_xyz=files["valid"], run_dir=str(Path(tmp) / "mace"))
        times = [t for epoch in mb.epoch_step_times(Path(tmp) / "mace").values() for t in epoch][warmup:]
    if len(times) < steps:
        raise RuntimeError(f"MACE logged {len(times) + warmup} step times, {warmup + steps} expected")
    t = statistics.median(times)
    return {"cpu_s": t, "wall_s": t, "steps": len(times), "source": f"MACE run_train, {dtype}, median of {len(times)} steps"}


def step_costs(root: Path, molecule: str, models: list[str], data_dir: Path, budget: Budget, *,
               fresh: bool = False, mace_dtype: str = "float64") -> dict[str, dict[str, float]]:
    """The stored step costs of ``ROOT/<molecule>/step_costs.json``, calibrated (the est models together,
    round-robin, then MACE, so they stay comparable) when one of ``models`` is missing or ``fresh``. A root
    without the file (a fresh clone, another machine) starts from the costs recorded in
    ``benchmarks/results/forces.json`` (``step_costs``), so ``--tables-only`` there reproduces the committed
    tables instead of re-timing the runs on a machine they never ran on."""
    path = Path(root) / molecule / "step_costs.json"
    stored = json.loads(path.read_text()) if path.exists() else recorded_step_costs(molecule)
    wanted = sorted(set(models) | set(stored))
    if fresh or any(m not in stored for m in models):
        from est.data.cache import atomic_json

        est_models, time_mace = [m for m in wanted if m != MACE], MACE in wanted and mb.available()
        print(f"[forces] {molecule}: timing one training step of {', '.join(est_models)} round-robin"
              + (", then MACE's" if time_mace else ""), flush=True)
        stored = calibrate(molecule, est_models, data_dir, budget)
        if time_mace:
            stored[MACE] = mace_step_cost(molecule, data_dir, root, budget, dtype=mace_dtype)
        atomic_json(str(path), stored)
    return stored


def recorded_step_costs(molecule: str) -> dict[str, dict[str, Any]]:
    """``{model: {"cpu_s", ...}}`` of ``molecule`` from the ``step_costs`` of the committed
    ``benchmarks/results/forces.json``; empty when there is none."""
    return dict((common.load("forces") or {}).get("step_costs", {}).get(molecule, {}))


def with_step_cost_clock(results: dict[str, dict[str, list[dict]]], costs: dict[str, dict[str, dict]]) -> None:
    """Add ``cost_seconds`` (steps x seconds per step) to every curve point, in place: the calibrated cost
    ``costs[molecule][model]`` (est models: interleaved; MACE: :func:`mace_step_cost`), else the run's own CPU
    seconds per step."""
    for molecule, per_model in results.items():
        for model, recs in per_model.items():
            for r in recs:
                cal = costs.get(molecule, {}).get(base_model(model))
                r["step_cost_s"] = cal["cpu_s"] if cal else r.get("cpu_ms_per_step", math.nan) / 1000.0
                r["step_cost_source"] = cal.get("source", "interleaved") if cal else "own run"
                for p in r.get("curve") or []:
                    p["cost_seconds"] = p["step"] * r["step_cost_s"]


def est_test_metrics(trainer, best: Path) -> dict[str, Any]:
    """``mace_baseline.force_metrics`` of the checkpoint ``best`` on ``trainer``'s test split, plus its CPU seconds."""
    from est.train import load_trained_model

    net, _ = load_trained_model(str(best))
    c0 = time.process_time()
    _, p = trainer.evaluate("test", module=net, collect=True)
    m = mb.force_metrics(p["energy_pred"], p["energy_true"], p["natoms"], p["forces_pred"], p["forces_true"])
    return m | {"cpu_s": time.process_time() - c0}


def refresh_metrics(rd: Path, data_dir: Path, budget: Budget) -> bool:
    """Give a finished run recorded before the per-frame test errors (``mace_baseline.FRAMES_KEY``) its test
    metrics again, from its kept checkpoint (est: ``best.pt``; MACE: its model file), the rest of the record
    (training, clock, MD) untouched; ``rd/test.json`` and ``rd/result.json`` are rewritten. False when the
    record has them already."""
    path = rd / "result.json"
    rec = json.loads(path.read_text())
    if mb.FRAMES_KEY in rec["metrics"]:
        return False
    old = rec["metrics"]
    if rec["kind"] == MACE:
        metrics = cached(rd / "test.json", lambda: mb.run_in_venv("evaluate", "--model", old["model"], "--xyz", old["xyz"],
                                                                  "--dtype", old.get("dtype", "float64")),
                         require=mb.FRAMES_KEY)
    else:
        import torch

        from est.train import Trainer, load_config

        torch.set_num_threads(1)
        trainer = Trainer(load_config(rec["overrides"]), datasets=est_datasets(data_dir, rec["molecule"], budget))
        metrics = cached(rd / "test.json", lambda: est_test_metrics(trainer, rd / "best.pt"), require=mb.FRAMES_KEY)
    moved = {k: (old[k], metrics[k]) for k in ("forces_mae_meV_A", "energy_mae_meV_atom") if old[k] != metrics[k]}
    if moved:
        print(f"[forces] {rd}: the re-evaluated test metrics differ from the recorded ones: {moved}", flush=True)
    rec["metrics"] = metrics
    from est.data.cache import atomic_json

    atomic_json(str(path), rec)
    return True


def time_budget(root: Path, molecule: str, model: str, data_dir: Path, budget: Budget, rd: Path) -> dict[str, Any]:
    """The step budget of a ``<model>@time`` run, fixed at its first start (``rd/time_budget.json``, so a
    later ``--calibrate`` does not change a run under way): ``{"steps", "seconds", "step_cost_s",
    "reference_step_cost_s"}``, ``steps`` = :func:`timed_steps` from the root's step costs (calibrated
    if missing), ``seconds`` = est-ffn's ``budget.steps`` x its step cost."""
    def compute() -> dict[str, Any]:
        costs = step_costs(root, molecule, [REFERENCE, base_model(model)], data_dir, budget)
        ref = costs[REFERENCE]["cpu_s"]
        return {"steps": timed_steps(costs, model, budget), "seconds": budget.steps * ref,
                "step_cost_s": costs[base_model(model)]["cpu_s"], "reference_step_cost_s": ref}

    rd.mkdir(parents=True, exist_ok=True)
    return cached(rd / "time_budget.json", compute)


def run_est(molecule: str, model: str, seed: int, rd: Path, data_dir: Path, budget: Budget, *,
            root: Path) -> dict[str, Any]:
    """One est run: train (resumable), then test metrics, trained rotation error and NVE MD (each cached).
    A ``<model>@time`` run trains for :func:`time_budget`'s steps (``root``: the study root, whose step
    costs set them)."""
    import torch

    from est.calculators import ESTCalculator
    from est.testing.check import load_model_for_check
    from est.train import Trainer, load_config

    torch.set_num_threads(1)
    datasets = est_datasets(data_dir, molecule, budget)
    natoms = int(datasets["train"][0].natoms)
    timing = time_budget(root, molecule, model, data_dir, budget, rd) if is_timed(model) else None
    cli = est_overrides(model, data_dir, molecule, seed, rd, budget, steps=timing["steps"] if timing else None)
    print(f"[forces] {molecule}/{model}/seed {seed}: python train.py {' '.join(cli)}", flush=True)
    trainer = Trainer(load_config(cli), datasets=datasets)
    clock = TrainingClock(trainer, rd / "curve.jsonl", natoms)
    t0 = time.perf_counter()
    clock.start()
    status = trainer.fit()
    wall, cpu = clock.stop()
    if status != "finished":
        raise SystemExit(f"[forces] {rd}: training interrupted at step {trainer.step}; run the study again to resume")
    val_eval_wall_s = max(time.perf_counter() - t0 - wall, 0.0)  # validation passes and start-up (of this call)
    best = rd / "best.pt"

    def equivariance() -> dict:
        net = load_model_for_check(checkpoint=str(best), dtype=torch.float64).eval()
        return common.trained_rotation_error(net, (("test frame", datasets["test"][0]),), "forces", model)

    def md() -> dict:
        start = relaxed_atoms(data_dir, molecule)
        calc = ESTCalculator(checkpoint=str(best), dtype=torch.float64)
        return mb.nve_md(start, calc, steps=budget.md_steps, timestep_fs=budget.md_timestep_fs,
                         temperature_K=budget.md_temperature_K, seed=seed, reference=start, every=budget.md_every,
                         checkpoint=str(rd / MD_STATE))

    metrics = cached(rd / "test.json", lambda: est_test_metrics(trainer, best), require=mb.FRAMES_KEY)
    eq = cached(rd / "equivariance.json", equivariance)
    md_result = cached(rd / "md.json", md)
    curve = clock.points
    return dict(molecule=molecule, model=model, seed=seed, kind="est", overrides=cli, steps=trainer.step,
                params=sum(p.numel() for p in trainer.module.parameters()), train_wall_s=wall, train_cpu_s=cpu,
                cpu_ms_per_step=1000.0 * cpu / max(trainer.step, 1), cpu_ms_per_step_steady=steady_ms_per_step(curve),
                val_eval_wall_s=val_eval_wall_s, curve=curve, metrics=metrics, equivariance=eq, md=md_result,
                model_config=trainer.model_cfg, **({"time_budget": timing} if timing else {}))


# ------------------------------------------------------------------ one MACE run (subprocess)
def run_mace(molecule: str, seed: int, rd: Path, data_dir: Path, root: Path, budget: Budget, dtype: str) -> dict[str, Any]:
    from est.data import LmdbDataset

    files = mace_files(data_dir, molecule, root, budget)
    n_train = len(split_indices(len(LmdbDataset(str(molecule_dir(data_dir, molecule) / "train"))), budget)[0])
    cfg = mb.MaceTrainConfig(seed=seed, threads=1, batch_size=budget.batch_size, default_dtype=dtype)
    cfg = replace(cfg, epochs=cfg.epochs_for_steps(budget.steps, n_train, valid_given=True))
    print(f"[forces] {molecule}/mace/seed {seed}: {cfg.epochs} epochs of {cfg.steps_per_epoch(n_train, valid_given=True)} "
          f"steps, {dtype}", flush=True)
    rec = mb.train(cfg, train_xyz=files["train"], test_xyz=None, valid_xyz=files["valid"], run_dir=str(rd / "mace"))
    ratio = rec["cpu_s"] / max(rec["wall_s"], 1e-9)  # MACE logs wall seconds per step only
    curve = [{"step": c["steps"], "seconds": c["opt_seconds"], "cpu_seconds": c["opt_seconds"] * ratio,
              "forces_mae_meV_A": c["forces_mae_meV_A"], "energy_mae_meV_atom": c["energy_mae_meV_atom"]}
             for c in rec["curve"]]
    metrics = cached(rd / "test.json", lambda: mb.run_in_venv("evaluate", "--model", rec["model"], "--xyz", files["test"],
                                                              "--dtype", dtype), require=mb.FRAMES_KEY)
    md_result = cached(rd / "md.json", lambda: mb.run_in_venv(
        "md", "--model", rec["model"], "--xyz", files["relaxed"], "--steps", str(budget.md_steps),
        "--timestep-fs", str(budget.md_timestep_fs), "--temperature", str(budget.md_temperature_K), "--seed", str(seed),
        "--every", str(budget.md_every), "--dtype", dtype, "--checkpoint", str(rd / MD_STATE)))
    steps = curve[-1]["step"] if curve else 0
    opt_cpu = rec.get("opt_s_total", 0.0) * ratio
    return dict(molecule=molecule, model=MACE, seed=seed, kind="mace", steps=steps, params=metrics.get("params"),
                train_wall_s=rec.get("opt_s_total"), train_cpu_s=opt_cpu, run_wall_s=rec["wall_s"], run_cpu_s=rec["cpu_s"],
                cpu_ms_per_step=1000.0 * opt_cpu / max(steps, 1), cpu_ms_per_step_steady=steady_ms_per_step(curve),
                curve=curve, metrics=metrics,
                equivariance=None, md=md_result, mace_config=rec["config"], mace_version=rec.get("mace_version"))


# ------------------------------------------------------------------ driver
def check_budget(root: Path, budget: Budget) -> None:
    """A root holds runs of one budget: the first call writes ``budget.json``, later calls must match it."""
    path = Path(root) / "budget.json"
    if path.exists():
        old = json.loads(path.read_text())
        if old != asdict(budget):
            diff = ", ".join(f"{k}: {old.get(k)} -> {v}" for k, v in asdict(budget).items() if old.get(k) != v)
            raise SystemExit(f"[forces] {root} holds runs with another budget ({diff}). Fix: pass another --root")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(budget), indent=1))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", default=os.environ.get("EST_XTB_DIR", str(REPO / "runs" / "data" / "xtb")),
                   help="the GFN2-xTB set (python -m est.data.xtb --out DIR); default $EST_XTB_DIR or runs/data/xtb")
    p.add_argument("--molecules", nargs="+", default=list(MOLECULES), choices=list(MOLECULES))
    p.add_argument("--models", nargs="+", default=[m for m in MODELS if m not in ABLATIONS], choices=MODEL_CHOICES,
                   help="default: every model but the ablations " + ", ".join(ABLATIONS) + f" and the {TIME_SUFFIX} "
                        "runs (MODEL@time: MODEL trained in est-ffn's time, its schedule ending there)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (one thread each)")
    p.add_argument("--root", default=str(REPO / "runs" / "forces"))
    p.add_argument("--quick", action="store_true", help="smoke run: 12 steps on 48 frames, 0.1 ps MD, in ROOT/quick")
    p.add_argument("--md-ps", type=float, default=None, help="NVE length in ps (default 10; quick 0.1)")
    p.add_argument("--mace-dtype", default="float64", choices=["float64", "float32"])
    p.add_argument("--clock", default="step-cost", choices=list(CLOCKS), help="seconds of the equal-time comparison")
    p.add_argument("--calibrate", action="store_true", help="re-time the est models' steps (step costs) before the tables")
    p.add_argument("--tables-only", action="store_true", help="no training: tables and plots from the stored runs")
    p.add_argument("--refresh-metrics", action="store_true",
                   help="first re-evaluate the test metrics of finished runs recorded without per-frame errors")
    p.add_argument("--one", nargs=3, metavar=("MOLECULE", "MODEL", "SEED"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    budget = QUICK if args.quick else FULL
    if args.md_ps is not None:
        budget = replace(budget, md_ps=args.md_ps)
    root = Path(args.root) / "quick" if args.quick else Path(args.root)
    data_dir = Path(args.data_dir)

    if args.one:
        molecule, model, seed = args.one[0], args.one[1], int(args.one[2])
        rd = run_dir(root, molecule, model, seed)
        t0, c0 = time.perf_counter(), time.process_time()
        load0 = os.getloadavg()[0]
        rec = (run_mace(molecule, seed, rd, data_dir, root, budget, args.mace_dtype) if model == MACE
               else run_est(molecule, model, seed, rd, data_dir, budget, root=root))
        rec.update(wall_s=time.perf_counter() - t0, process_cpu_s=time.process_time() - c0, loadavg=[load0, os.getloadavg()[0]],
                   budget=asdict(budget))
        (rd / "result.json").write_text(json.dumps(rec, indent=1, default=str))
        return 0

    t0 = time.perf_counter()
    jobs = [(m, model, s) for s in args.seeds for m in args.molecules for model in args.models]
    if not args.tables_only:
        check_budget(root, budget)
        if MACE in args.models and not mb.available():
            print(f"[forces] {mb.MISSING} ({mb.venv_python()})", flush=True)
            jobs = [j for j in jobs if j[1] != MACE]
        for molecule in args.molecules:
            try:
                molecule_dir(data_dir, molecule)
            except FileNotFoundError as exc:
                raise SystemExit(f"[forces] {exc}") from None
            if any(j[1] == MACE for j in jobs):
                mace_files(data_dir, molecule, root, budget)
            timed_models = sorted({base_model(j[1]) for j in jobs if j[0] == molecule and is_timed(j[1])})
            if timed_models:  # calibrated here, once, before the runs load the machine
                step_costs(root, molecule, [REFERENCE, *timed_models], data_dir, budget)
        if args.refresh_metrics:
            for job in jobs:
                rd = run_dir(root, *job)
                if (rd / "result.json").exists() and refresh_metrics(rd, data_dir, budget):
                    print(f"[forces] {job}: test metrics re-evaluated with per-frame errors", flush=True)
        common.launch(jobs, command=lambda job: [sys.executable, __file__, "--one", *map(str, job), "--root", args.root,
                                                 "--data-dir", str(data_dir), "--mace-dtype", args.mace_dtype,
                                                 *(["--quick"] if args.quick else []),
                                                 *(["--md-ps", str(args.md_ps)] if args.md_ps is not None else [])],
                      run_dir=lambda job: run_dir(root, *job), parallel=args.jobs, tag="forces")
    results = common.load_results(jobs, lambda job: run_dir(root, *job))
    if results and not args.quick:  # runs of the other molecules, models and seeds already in forces.json stay
        results = common.merge_runs("forces", results, compatible=lambda old: old.get("budget") == asdict(budget)
                                    and old.get("mace_dtype") == args.mace_dtype)
    costs = {}
    for molecule, per_model in results.items():
        timed = sorted({base_model(m) for m in per_model if m != MACE or mb.available()})  # MACE: timed in its venv
        if any(m != MACE for m in timed) and not args.quick:
            try:
                costs[molecule] = step_costs(root, molecule, timed, data_dir, budget, fresh=args.calibrate,
                                             mace_dtype=args.mace_dtype)
            except FileNotFoundError as exc:  # no data here: each run's own CPU seconds per step
                print(f"[forces] {molecule}: no step costs ({exc})", flush=True)
    with_step_cost_clock(results, costs)
    text = tables(results, clock=args.clock)
    for name, tbl in text.items():
        print(f"### {name}\n\n{tbl}\n", flush=True)
    if not results:
        return 0
    if args.quick:
        print(f"### projected CPU time of one full run ({FULL.steps} steps, {FULL.md_ps:g} ps MD)\n\n"
              f"{projection(results, FULL)}\n", flush=True)
    plots = plot_curves(results, (root if args.quick else common.RESULTS) / "plots", clock=args.clock)
    payload = dict(description=__doc__.split("\n\n")[0], shape=SHAPE, models=MODELS, budget=asdict(budget),
                   seeds=sorted({r["seed"] for ms in results.values() for recs in ms.values() for r in recs}), clock=args.clock, data_dir=str(data_dir), mace_dtype=args.mace_dtype,
                   wall_s=time.perf_counter() - t0, runs=results, step_costs=costs, tables=text)
    manifest = data_dir / "manifest.json"
    if manifest.exists():
        payload["data_manifest"] = json.loads(manifest.read_text())
    if args.quick:
        path = root / "forces.json"
        path.write_text(json.dumps(payload, indent=1, default=str))
    else:
        path = common.save("forces", payload)
    print(f"[forces] wrote {path} and {', '.join(map(str, plots))}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
