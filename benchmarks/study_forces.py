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
* ``est-ffn-g18``, ``est-default-g18``: ``est-ffn`` and ``est-default`` on
  EquiformerV2's published 18 x 18 grid instead of the tiny shape's 10 x 9
  (messages, FFN, heads; the EST block keeps its design): the comparison at
  equal trained equivariance (the 10 x 9 grid leaves est's EquiformerV2 a
  trained rotation error of 6e-4 to 5.6e-3, 18 x 18 about 1e-6). Each
  ``-g18`` model is read against ``est-ffn-g18`` (ratios, equal time, its
  ``@time`` budget; ``forces_setup.reference_of``), ``est-ffn-g18`` against
  ``est-ffn``; the target line is repeated for the pair.
* ``est-ffn-w2``, ``est-default-w2``, ``est-skip-t12-w2``: the same models at
  twice the width (channels and attention hidden channels 64, feed-forward hidden
  128), where the EST steps cost less than EquiformerV2's; each is read against
  ``est-ffn-w2`` (that one against ``est-ffn``), like the 18 x 18 pair.
* ``est-ffn-lr1e-3``, ``est-default-lr1e-3``, ``est-skip-t12-lr1e-3``: the same
  models at learning rate 1e-3, twice the recipe's 5e-4 (est's trainer default;
  EquiformerV2's OC20 peak is 4e-4); each is charged its model's step cost and read against
  ``est-ffn-lr1e-3`` (that one against ``est-ffn``), like the 18 x 18 pair.
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
x that cost. A model added later is timed round-robin with est-ffn and
anchored to est-ffn's stored cost (:func:`anchored_costs`), so the stored
costs and the tables read with them do not move. MACE
runs in its own environment and cannot be interleaved: right after the est
models it is timed by a short ``run_train`` of the study's config on the first
frames (:func:`mace_step_cost`: the median of MACE's own per-step times after
warm-up, same batch size, one thread), so a quiet machine during
``--calibrate`` makes its cost comparable; without that timing (no venv) its
cost is its own run's CPU seconds per step, which carry that run's load.
Every step cost is timed with glibc keeping freed memory (``est.train.malloc``;
``forces_clock.ALLOCATOR``, recorded as ``allocator``): glibc's default
unmaps large freed blocks and the page faults cost MACE's float64 step
1.3-1.65x against est's 1.1x, an allocator artefact, not the models' work
(``bench_cpu_malloc.py``). MACE's own training runs keep freed memory too,
for speed only.
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
A ``<model>@w2-time`` run (``--models est-default@w2-time est-ffn@w2-time``)
is the same for the larger model: a 32-channel model trained for the steps
that cost what ``est-ffn-w2``'s 1,500 cost, read against ``est-ffn-w2``: the
paper's "small models empowered by EST can outperform larger models" at equal
time (the EST default has 395k parameters, ``est-ffn-w2`` 1.32M), with
``est-ffn@w2-time`` as the control; the ``-time`` table adds their lines
(bound 1.00) and the issue's target between the two (bound 0.90: the EST
default against EquiformerV2 at twice the time; ``forces_setup.TEST_PAIRS``).

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

Each (molecule, model, seed) is one subprocess with one thread (``--threads``:
more, for a run that must finish sooner; it changes the wall-clock only, as the
equal-time budgets and the step-cost clock use the one-thread step costs, but the
run's own CPU seconds, for training and MD, then count every thread: the run
records ``threads``, those of the call that finished it; on aspirin at 64
channels two threads gave about 1.1x one thread's speed, so two one-thread runs
side by side use two cores better), ``--jobs`` at a time, in ``ROOT/<molecule>/<model>-s<seed>/``; it resumes a killed run
(est: the trainer's ``last.pt`` and ``curve.jsonl``; MACE: its own checkpoint;
test metrics, equivariance and MD are kept in their own JSON files; the MD
saves its trajectory state every 1,000 steps in ``md_state.json``) and is
skipped once ``result.json`` exists (delete the folder to rerun it). The
budget of a root is fixed by its first call (``ROOT/budget.json``). New runs
are merged with the runs stored in ``forces.json`` only when each molecule's
set in DATA is the one the stored runs trained on (``forces_provenance.py``:
the generator's manifest against ``data_manifest``, checked before any run;
``data_checks`` records when); the stored file's other fields stay. Drivers
run side by side (one per core): each reads, merges and writes ``forces.json``
under the file's lock (``common.locked``), when its runs end.

    python benchmarks/study_forces.py --data-dir DATA                 # 4 molecules x 5 models x 3 seeds
    python benchmarks/study_forces.py --data-dir DATA --molecules ethanol --models est-ffn est-default --seeds 0
    python benchmarks/study_forces.py --data-dir DATA --quick --molecules ethanol   # smoke run (ROOT/quick), with
                                                                      # the projected CPU hours of the full runs
    python benchmarks/study_forces.py --tables-only                   # tables and plots from the stored runs
    python benchmarks/study_forces.py --status                        # each run's stage, progress, time left

This file runs the study (one run, the driver); its parts: ``forces_setup.py``
(molecules, models, budget, run folders, data, an est run's overrides),
``forces_clock.py`` (the training clock and the step costs),
``forces_provenance.py`` (which data sets the stored runs trained on),
``forces_status.py`` (where each run of a root stands, from its folder) and
``forces_tables.py`` (curves, tables, plots; what ``summary.py`` renders).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "baseline"))

import common  # noqa: E402
import mace_baseline as mb  # noqa: E402
from forces_clock import (TrainingClock, steady_ms_per_step, step_costs, time_budget,  # noqa: E402
                          with_step_cost_clock)
from forces_setup import (ABLATIONS, CLOCKS, FULL, MACE, MD_STATE, MODEL_CHOICES, MODELS, MOLECULES,  # noqa: E402
                          QUICK, REFERENCE, SHAPE, TIME_SUFFIX, Budget, cached, cost_model, est_datasets,
                          est_overrides, is_timed, mace_files, molecule_dir, reference_of, relaxed_atoms, run_dir,
                          split_indices)
from forces_provenance import check_record, checked_manifest  # noqa: E402
from forces_status import merged_runs, status_table  # noqa: E402
from forces_tables import plot_curves, projection, tables  # noqa: E402


# ------------------------------------------------------------------ one est run (subprocess)
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
    common.write_result(rd, rec)
    return True


def run_est(molecule: str, model: str, seed: int, rd: Path, data_dir: Path, budget: Budget, *,
            root: Path, threads: int = 1) -> dict[str, Any]:
    """One est run: train (resumable), then test metrics, trained rotation error and NVE MD (each cached).
    A ``<model>@time`` run trains for :func:`time_budget`'s steps (``root``: the study root, whose step
    costs set them)."""
    import torch

    from est.calculators import ESTCalculator
    from est.testing.check import load_model_for_check
    from est.train import Trainer, load_config

    torch.set_num_threads(threads)
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
def run_mace(molecule: str, seed: int, rd: Path, data_dir: Path, root: Path, budget: Budget, dtype: str, *,
             threads: int = 1) -> dict[str, Any]:
    from est.data import LmdbDataset

    files = mace_files(data_dir, molecule, root, budget)
    n_train = len(split_indices(len(LmdbDataset(str(molecule_dir(data_dir, molecule) / "train"))), budget)[0])
    cfg = mb.MaceTrainConfig(seed=seed, threads=threads, batch_size=budget.batch_size, default_dtype=dtype,
                             keep_freed_memory=True)  # speed only: its clock is mace_step_cost
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
                        "runs (MODEL@time: MODEL trained in est-ffn's time, its schedule ending there; MODEL@w2-time: "
                        "the same in est-ffn-w2's time)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--jobs", type=int, default=2, help="runs at a time")
    p.add_argument("--threads", type=int, default=1,
                   help="threads per run (1: the study's protocol; more changes the wall-clock, not the budgets)")
    p.add_argument("--root", default=str(REPO / "runs" / "forces"))
    p.add_argument("--quick", action="store_true", help="smoke run: 12 steps on 48 frames, 0.1 ps MD, in ROOT/quick")
    p.add_argument("--md-ps", type=float, default=None, help="NVE length in ps (default 10; quick 0.1)")
    p.add_argument("--mace-dtype", default="float64", choices=["float64", "float32"])
    p.add_argument("--clock", default="step-cost", choices=list(CLOCKS), help="seconds of the equal-time comparison")
    p.add_argument("--calibrate", action="store_true", help="re-time the est models' steps (step costs) before the tables")
    p.add_argument("--tables-only", action="store_true", help="no training: tables and plots from the stored runs")
    p.add_argument("--refresh-metrics", action="store_true",
                   help="first re-evaluate the test metrics of finished runs recorded without per-frame errors")
    p.add_argument("--status", action="store_true",
                   help="where each run under ROOT stands (training or NVE step, time left at its pace, merged or "
                        "not); runs nothing")
    p.add_argument("--one", nargs=3, metavar=("MOLECULE", "MODEL", "SEED"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.threads < 1:
        p.error(f"--threads must be at least 1, got {args.threads}")
    budget = QUICK if args.quick else FULL
    if args.md_ps is not None:
        budget = replace(budget, md_ps=args.md_ps)
    root = Path(args.root) / "quick" if args.quick else Path(args.root)
    data_dir = Path(args.data_dir)

    if args.status:
        print(status_table(root, budget, merged_runs(None if args.quick else common.load("forces"))), flush=True)
        return 0

    if args.one:
        molecule, model, seed = args.one[0], args.one[1], int(args.one[2])
        rd = run_dir(root, molecule, model, seed)
        t0, c0 = time.perf_counter(), time.process_time()
        load0 = os.getloadavg()[0]
        rec = (run_mace(molecule, seed, rd, data_dir, root, budget, args.mace_dtype, threads=args.threads)
               if model == MACE else run_est(molecule, model, seed, rd, data_dir, budget, root=root, threads=args.threads))
        rec.update(threads=args.threads, wall_s=time.perf_counter() - t0, process_cpu_s=time.process_time() - c0, loadavg=[load0, os.getloadavg()[0]],
                   budget=asdict(budget))
        common.write_result(rd, rec)
        return 0

    t0 = time.perf_counter()
    jobs = [(m, model, s) for s in args.seeds for m in args.molecules for model in args.models]

    def compatible(stored: dict) -> bool:  # runs of the same budget and MACE precision are merged
        return stored.get("budget") == asdict(budget) and stored.get("mace_dtype") == args.mace_dtype

    def load_stored() -> dict | None:  # one study per results file: never overwritten by another's runs
        stored = None if args.quick else common.load("forces")
        if stored and not compatible(stored):
            raise SystemExit(f"[forces] benchmarks/results/forces.json holds runs of another budget or MACE "
                             f"precision (budget {stored.get('budget')}, mace_dtype {stored.get('mace_dtype')}; "
                             f"asked {asdict(budget)}, {args.mace_dtype}). Fix: the stored study's flags, --quick, "
                             "or move the file away to start a new study")
        return stored

    def checked_data(manifest: dict | None) -> tuple[dict, dict[str, str]]:  # there, complete, stored (or new)
        try:
            return checked_manifest(manifest, data_dir, args.molecules)
        except (FileNotFoundError, ValueError) as exc:
            raise SystemExit(f"[forces] {exc}") from None

    if not args.tables_only:
        check_budget(root, budget)
        # before any run: each molecule's set is the stored runs' one (checked again, and kept, at the merge)
        checked_data((load_stored() or {}).get("data_manifest"))
        if MACE in args.models and not mb.available():
            print(f"[forces] {mb.MISSING} ({mb.venv_python()})", flush=True)
            jobs = [j for j in jobs if j[1] != MACE]
        for molecule in args.molecules:
            if any(j[1] == MACE for j in jobs):
                mace_files(data_dir, molecule, root, budget)
            timed_models = sorted({m for j in jobs if j[0] == molecule and is_timed(j[1])
                                   for m in (cost_model(j[1]), reference_of(j[1]))})
            if timed_models:  # calibrated here, once, before the runs load the machine
                step_costs(root, molecule, list(dict.fromkeys([REFERENCE, *timed_models])), data_dir, budget)
        if args.refresh_metrics:
            for job in jobs:
                rd = run_dir(root, *job)
                if (rd / "result.json").exists() and refresh_metrics(rd, data_dir, budget):
                    print(f"[forces] {job}: test metrics re-evaluated with per-frame errors", flush=True)
        common.launch(jobs, command=lambda job: [sys.executable, __file__, "--one", *map(str, job), "--root", args.root,
                                                 "--data-dir", str(data_dir), "--mace-dtype", args.mace_dtype,
                                                 "--threads", str(args.threads),
                                                 *(["--quick"] if args.quick else []),
                                                 *(["--md-ps", str(args.md_ps)] if args.md_ps is not None else [])],
                      run_dir=lambda job: run_dir(root, *job), parallel=args.jobs, tag="forces")
    # the results file is read (again, after runs of hours: another driver may have merged its runs or added a
    # molecule meanwhile), merged and written under its lock, so two drivers that end together keep both's runs
    with contextlib.nullcontext() if args.quick else common.locked(common.results_file("forces")):
        stored = load_stored()
        manifest, checked = (((stored or {}).get("data_manifest"), {}) if args.tables_only
                             else checked_data((stored or {}).get("data_manifest")))
        results = common.load_results(jobs, lambda job: run_dir(root, *job))
        other = [f"{r['molecule']}/{r['model']}/seed {r['seed']}" for ms in results.values() for recs in ms.values()
                 for r in recs if r.get("budget", asdict(budget)) != asdict(budget)]
        if other:  # --tables-only does not check ROOT/budget.json: a record must not be relabelled with this budget
            raise SystemExit(f"[forces] runs in {root} of another budget than asked ({', '.join(other)}). Fix: the flags "
                             "they ran with (--md-ps, --quick) or another --root")
        if not args.quick:  # runs of the other molecules, models and seeds already in forces.json stay (and render)
            results = common.merge_runs("forces", results, compatible=compatible, stored=stored or {})
        costs = {}
        for molecule, per_model in results.items():
            timed = sorted({cost_model(m) for m in per_model if m != MACE or mb.available()})  # MACE: timed in its venv
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
                       seeds=sorted({r["seed"] for ms in results.values() for recs in ms.values() for r in recs}), clock=args.clock, mace_dtype=args.mace_dtype,
                       runs=results, step_costs=costs, tables=text)
        if not args.tables_only:  # a re-rendering keeps the data folder, wall time and machine of the last run
            payload.update(data_dir=str(data_dir), wall_s=time.perf_counter() - t0)
        if manifest:
            payload["data_manifest"] = manifest
        if checked:
            payload["data_checks"] = {**(stored or {}).get("data_checks", {}), **check_record(checked)}
        # what the stored file holds beyond this call's fields (notes, the last run's wall_s) stays, in its order
        payload = {k: payload.get(k, v) for k, v in (stored or {}).items()} | payload
        if args.quick:
            path = root / "forces.json"
            path.write_text(json.dumps(payload, indent=1, default=str))
        else:
            path = common.save("forces", payload, machine=not args.tables_only)
        print(f"[forces] wrote {path} and {', '.join(map(str, plots))}", flush=True)
        return 0


if __name__ == "__main__":
    sys.exit(main())
