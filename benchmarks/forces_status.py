"""Where each run of a force study stands (``study_forces.py --status``), read from the small files in its run
folder: nothing is run or written, and no checkpoint is loaded.

A run folder ``ROOT/<molecule>/<model>-s<seed>`` goes through these stages, each leaving a file behind:

=========================  =====================================================================================
stage                      its file (the furthest one present decides)
=========================  =====================================================================================
training                   ``curve.jsonl`` (est, one line per evaluation; ``last.pt`` every 50 steps) or MACE's
                           results log under ``mace/`` (one checkpoint per epoch)
tested                     ``test.json``: test metrics of the best checkpoint (then the trained rotation error)
NVE                        ``md_state.json``: the 10 ps trajectory's state, every 1,000 MD steps
NVE done                   ``md.json``
finished                   ``result.json``: the run's record
merged                     the record in ``benchmarks/results/forces.json`` (the driver merges when it ends)
=========================  =====================================================================================

"left" extrapolates the stage's own pace so far: training from its learning curve's seconds per step
(``(T_last - T_first) / (step_last - step_first)`` over the recorded evaluations), the NVE from the wall seconds
its state has spent per MD step. It is this stage's remainder only, at this machine's current load.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable

from forces_clock import read_curve
from forces_setup import MACE, MD_STATE, MOLECULES, Budget

import mace_baseline as mb

#: ``<model>-s<seed>``, the folder name of one run (``forces_setup.run_dir``)
_RUN = re.compile(r"^(?P<model>.+)-s(?P<seed>\d+)$")


@dataclass(frozen=True)
class Stage:
    """One run's stage: its name, progress ``done`` of ``total`` ``unit`` (None where it has none), the seconds
    the stage still needs at its own pace (None: unknown), and the newest write in its folder (epoch s)."""

    name: str
    done: int | None = None
    total: int | None = None
    unit: str = "steps"
    left_s: float | None = None
    last_write: float | None = None


def run_folders(root: Path) -> list[tuple[str, str, int, Path]]:
    """``(molecule, model, seed, folder)`` of every run folder under ``root``, in the study's molecule order."""
    found = []
    for molecule in MOLECULES:
        for path in sorted((Path(root) / molecule).glob("*-s*")):
            if path.is_dir() and (m := _RUN.match(path.name)):
                found.append((molecule, m["model"], int(m["seed"]), path))
    return found


def _pace(points: list[tuple[int, float]]) -> float | None:
    """Seconds per step over ``(step, seconds)`` points; None with fewer than two distinct steps."""
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        return None
    return (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0])


def _training(rd: Path, model: str, budget: Budget) -> Stage:
    if model == MACE:  # MACE counts whole epochs, so it may run up to one epoch past the budget's steps
        if not (rd / "mace").is_dir():
            return Stage("not started")
        curve = mb.learning_curve(rd / "mace")
        points = [(int(c["steps"]), float(c["opt_seconds"])) for c in curve]
        total = budget.steps
    else:
        path = rd / "curve.jsonl"
        if not path.exists():
            return Stage("not started")
        points = [(int(r["step"]), float(r["seconds"])) for r in read_curve(path)]
        timing = rd / "time_budget.json"  # an @time run trains the steps its time buys
        total = int(json.loads(timing.read_text())["steps"]) if timing.exists() else budget.steps
    done = points[-1][0] if points else 0
    pace = _pace(points)
    return Stage("training", done=done, total=total, left_s=None if pace is None else pace * max(total - done, 0))


def stage(rd: Path, model: str, budget: Budget, *, merged: bool = False) -> Stage:
    """The stage of the run in folder ``rd`` (its ``model``; ``merged``: its record is in the results file)."""
    rd = Path(rd)
    last = max((p.stat().st_mtime for p in rd.rglob("*") if p.is_file()), default=None)
    if (rd / "result.json").exists():
        found = Stage("merged" if merged else "finished, not merged")
    elif (rd / "md.json").exists():
        found = Stage("NVE done, record not written", done=budget.md_steps, total=budget.md_steps, unit="MD steps")
    elif (rd / MD_STATE).exists():
        state = json.loads((rd / MD_STATE).read_text())
        done = int(state["done"])
        wall = float(state["spent"][0])
        found = Stage("NVE", done=done, total=budget.md_steps, unit="MD steps",
                      left_s=wall / done * (budget.md_steps - done) if done else None)
    elif (rd / "test.json").exists():
        found = Stage("tested, NVE next", done=0, total=budget.md_steps, unit="MD steps")
    else:
        found = _training(rd, model, budget)
    return replace(found, last_write=last)


def _hours(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes = int(round(seconds / 60.0))
    return f"{minutes // 60}:{minutes % 60:02d}"


def status_table(root: Path, budget: Budget, merged: Iterable[tuple[str, str, int]], *,
                 now: float | None = None) -> str:
    """A markdown table of every run folder under ``root``: stage, progress, time left at its pace (h:mm) and how
    long ago its folder was last written (a run that should be alive and has not written for long is not)."""
    merged = set(merged)
    now = time.time() if now is None else now
    rows = ["| molecule | model | seed | stage | progress | left (h:mm, its pace) | last write (min ago) |",
            "|---|---|---|---|---|---|---|"]
    for molecule, model, seed, rd in run_folders(root):
        st = stage(rd, model, budget, merged=(molecule, model, seed) in merged)
        progress = f"{st.done:,} / {st.total:,} {st.unit}" if st.total is not None else "-"
        ago = "-" if st.last_write is None else f"{(now - st.last_write) / 60.0:.0f}"
        rows.append(f"| {molecule} | {model} | {seed} | {st.name} | {progress} | {_hours(st.left_s)} | {ago} |")
    if len(rows) == 2:
        return f"no run folders under {root}"
    return "\n".join(rows)


def merged_runs(stored: dict | None) -> set[tuple[str, str, int]]:
    """``(molecule, model, seed)`` of every run recorded in a results file's payload."""
    return {(molecule, model, int(r["seed"])) for molecule, per in (stored or {}).get("runs", {}).items()
            for model, recs in per.items() for r in recs}
