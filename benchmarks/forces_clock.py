"""The force study's clocks (``study_forces.py``): optimisation seconds of a run (:class:`TrainingClock`),
the step costs of the models timed round-robin (:func:`calibrate`, :func:`step_costs`; MACE's in its venv,
:func:`mace_step_cost`), the step-cost clock on the curves and the step budget of a ``<model>@time`` run."""
from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import common
from forces_setup import (MACE, REFERENCE, Budget, cached, cost_model, est_datasets, est_overrides, mace_files, mb,
                          molecule_dir, reference_of, timed_steps)


def read_curve(path: Path) -> list[dict]:
    """The learning-curve points in ``path`` (JSON lines; none if it does not exist). A last line cut short
    (a process killed while appending it) is dropped, so the run resumes from the points before it; a bad
    line anywhere else is an error that names the file and the line."""
    path = Path(path)
    lines = [x for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    points = []
    for i, line in enumerate(lines, start=1):
        try:
            points.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if i == len(lines):
                break
            raise ValueError(f"{path}: line {i} is not a learning-curve point ({exc}). Fix: delete that line, "
                             "or the run folder to rerun the run") from None
    return points


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
        self.points = [p for p in read_curve(self.path) if p["step"] <= trainer.step]
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


#: the C allocator every step cost is timed under (``"allocator"`` of each entry): glibc keeping freed
#: memory (``est.train.malloc``), in this process for the est models and in MACE's (``MaceTrainConfig``).
#: glibc's default unmaps large freed blocks, and the page faults that costs on every step are an artefact
#: of the allocator that falls on the models unevenly (MACE in float64 more than est; ``bench_cpu_malloc.py``)
ALLOCATOR = "keep_freed_memory"


def calibrate(molecule: str, models: list[str], data_dir: Path, budget: Budget, *, rounds: int = 7,
              warmup: int = 2, keep_freed: bool = True, extra: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """``{model: {"cpu_s", "wall_s", "rounds", "allocator"}}``: median seconds of one optimisation step of
    each est model, timed round-robin (every model once per round, the same training batch) in this process
    on one thread, so that the machine's load falls on all models alike and their ratio is fair.
    ``keep_freed`` turns :data:`ALLOCATOR` on for this process first (for good); False leaves the process's
    allocator as it is (``allocator``: ``"as started"``). ``extra``: overrides applied to every model after
    its own (e.g. ``("model.lmax=6",)``)."""
    import tempfile

    import torch

    from est.train import Trainer, load_config
    from est.train.data import make_loader
    from est.train.malloc import keep_freed_memory

    allocator = ALLOCATOR if keep_freed and keep_freed_memory() else "as started"
    torch.set_num_threads(1)
    datasets = est_datasets(data_dir, molecule, budget)
    times: dict[str, dict[str, list[float]]] = {m: {"cpu_s": [], "wall_s": []} for m in models}
    with tempfile.TemporaryDirectory() as tmp:
        trainers = {m: Trainer(load_config([*est_overrides(m, data_dir, molecule, 0, Path(tmp) / m, budget), *extra]),
                               datasets=datasets) for m in models}
        first = trainers[models[0]]
        loader = make_loader(first.train_ds, first.sampler)
        batches = (b for _ in range(warmup + rounds) for b in loader)  # a small training set is passed again
        for r in range(warmup + rounds):
            batch = next(batches)
            for m, trainer in trainers.items():
                w0, c0 = time.perf_counter(), time.process_time()
                trainer.train_step(batch)
                if r >= warmup:
                    times[m]["wall_s"].append(time.perf_counter() - w0)
                    times[m]["cpu_s"].append(time.process_time() - c0)
    return {m: {k: statistics.median(v) for k, v in t.items()} | {"rounds": rounds, "allocator": allocator}
            for m, t in times.items()}


def mace_step_cost(molecule: str, data_dir: Path, root: Path, budget: Budget, *, dtype: str = "float64",
                   steps: int = 12, warmup: int = 3, keep_freed: bool = True) -> dict[str, Any]:
    """``{"cpu_s", "wall_s", "steps", "allocator", "source"}``: seconds of one MACE optimisation step on one
    thread, the median of MACE's own per-step times (its results file) over ``steps`` steps after ``warmup``,
    from one epoch of ``run_train`` with the study's config and batch size on the first ``(warmup + steps) x
    batch`` training frames, in a temporary folder (the study's runs are not touched), glibc keeping freed
    memory (:data:`ALLOCATOR`) as the est models do (``keep_freed=False``: glibc's default, ``"glibc
    default"``). MACE logs wall seconds per step; on one thread of a quiet machine they are its CPU seconds
    (the est models' costs are CPU seconds). The MACE process's CPU share of its wall time over the call is
    recorded (``cpu_share``; start-up reads files, so a little under 1 on a quiet machine); below 0.9 other
    work was time-slicing the core: the step is then charged its wall time times that share, as
    :func:`run_mace`'s curves are, with a warning (pause other work for a clean timing)."""
    import tempfile

    files = mace_files(data_dir, molecule, root, budget)
    with tempfile.TemporaryDirectory() as tmp:
        sub = Path(tmp) / "train.xyz"
        mb.export_xyz(molecule_dir(data_dir, molecule) / "train", sub, limit=(warmup + steps) * budget.batch_size)
        cfg = mb.MaceTrainConfig(seed=0, epochs=1, threads=1, batch_size=budget.batch_size, default_dtype=dtype,
                                 keep_freed_memory=keep_freed)
        rec = mb.train(cfg, train_xyz=str(sub), test_xyz=None, valid_xyz=files["valid"],
                       run_dir=str(Path(tmp) / "mace"))
        times = [t for epoch in mb.epoch_step_times(Path(tmp) / "mace") for t in epoch][warmup:]
    if len(times) < steps:
        raise RuntimeError(f"MACE logged {len(times) + warmup} step times, {warmup + steps} expected")
    t = statistics.median(times)
    share = min(rec["cpu_s"] / max(rec["wall_s"], 1e-9), 1.0)  # the MACE process's CPU share of its wall time
    if share < 0.9:
        print(f"[forces] {molecule}: MACE had {share:.0%} of a core while timed; its step cost is scaled by that. "
              "Pause other work for a clean timing", flush=True)
    return {"cpu_s": t * share if share < 0.9 else t, "wall_s": t, "cpu_share": round(share, 3), "steps": len(times),
            "allocator": ALLOCATOR if keep_freed else "glibc default",
            "source": f"MACE run_train, {dtype}, median of {len(times)} steps"}


def step_costs(root: Path, molecule: str, models: list[str], data_dir: Path, budget: Budget, *,
               fresh: bool = False, mace_dtype: str = "float64") -> dict[str, dict[str, float]]:
    """The stored step costs of ``ROOT/<molecule>/step_costs.json``. A root without the file (a fresh clone,
    another machine) starts from the costs recorded in ``benchmarks/results/forces.json`` (``step_costs``),
    so ``--tables-only`` there reproduces the committed tables instead of re-timing the runs on a machine they
    never ran on.

    Everything is calibrated (the est models together, round-robin, then MACE, so they stay comparable) when
    ``fresh``, when nothing is stored, when one stored cost predates the allocator rule (no ``"allocator"``:
    all are re-timed, never a mix) or when MACE or the reference is among the missing. An est model that is
    only missing is anchored (:func:`anchored_costs`): timed round-robin with the reference and charged the
    reference's stored cost times their fresh ratio, so the stored costs, and the tables read with them,
    stay as they are."""
    path = Path(root) / molecule / "step_costs.json"
    stored = json.loads(path.read_text()) if path.exists() else recorded_step_costs(molecule)
    missing = [m for m in models if m not in stored]
    full = (fresh or not stored or any("allocator" not in c for c in stored.values())
            or any(m in (MACE, REFERENCE) for m in missing))
    if not full and not missing:
        return stored
    from est.data.cache import atomic_json

    if full:
        wanted = sorted(set(models) | set(stored))
        est_models, time_mace = [m for m in wanted if m != MACE], MACE in wanted and mb.available()
        print(f"[forces] {molecule}: timing one training step of {', '.join(est_models)} round-robin"
              + (", then MACE's" if time_mace else ""), flush=True)
        stored = calibrate(molecule, est_models, data_dir, budget)
        if time_mace:
            stored[MACE] = mace_step_cost(molecule, data_dir, root, budget, dtype=mace_dtype)
    else:
        print(f"[forces] {molecule}: timing one training step of {', '.join(missing)} round-robin with "
              f"{REFERENCE}, anchored to its stored cost", flush=True)
        stored = stored | anchored_costs(calibrate(molecule, [REFERENCE, *missing], data_dir, budget), stored[REFERENCE])
    atomic_json(str(path), stored)
    return stored


def anchored_costs(timed: dict[str, dict[str, Any]], reference: dict[str, Any]) -> dict[str, dict[str, Any]]:
    r"""The models of one round-robin ``timed`` with the reference, on the stored calibration's scale:
    :math:`c_m = c_\mathrm{ref}^\mathrm{stored}\,t_m / t_\mathrm{ref}` (CPU and wall seconds alike), each
    with the fresh ratio (``"ratio_to_reference"``) and its source."""
    t_ref = timed[REFERENCE]
    return {m: t | {"cpu_s": reference["cpu_s"] * t["cpu_s"] / t_ref["cpu_s"],
                    "wall_s": reference["wall_s"] * t["wall_s"] / t_ref["wall_s"],
                    "ratio_to_reference": t["cpu_s"] / t_ref["cpu_s"],
                    "source": f"interleaved with {REFERENCE}, anchored to its stored cost"}
            for m, t in timed.items() if m != REFERENCE}


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
                cal = costs.get(molecule, {}).get(cost_model(model))
                r["step_cost_s"] = cal["cpu_s"] if cal else r.get("cpu_ms_per_step", math.nan) / 1000.0
                r["step_cost_source"] = cal.get("source", "interleaved") if cal else "own run"
                for p in r.get("curve") or []:
                    p["cost_seconds"] = p["step"] * r["step_cost_s"]


def time_budget(root: Path, molecule: str, model: str, data_dir: Path, budget: Budget, rd: Path) -> dict[str, Any]:
    """The step budget of a ``<model>@time`` run, fixed at its first start (``rd/time_budget.json``, so a
    later ``--calibrate`` does not change a run under way): ``{"steps", "seconds", "step_cost_s",
    "reference_step_cost_s"}``, ``steps`` = :func:`timed_steps` from the root's step costs (calibrated
    if missing), ``seconds`` = the reference's (:func:`reference_of`) ``budget.steps`` x its step cost."""
    def compute() -> dict[str, Any]:
        ref_model = cost_model(reference_of(model))  # the cost its curve is charged
        costs = step_costs(root, molecule, list(dict.fromkeys([REFERENCE, ref_model, cost_model(model)])), data_dir, budget)
        ref = costs[ref_model]["cpu_s"]
        return {"steps": timed_steps(costs, model, budget), "seconds": budget.steps * ref,
                "step_cost_s": costs[cost_model(model)]["cpu_s"], "reference_step_cost_s": ref}

    rd.mkdir(parents=True, exist_ok=True)
    return cached(rd / "time_budget.json", compute)
