#!/usr/bin/env python
r"""Accuracy at equal budget: fairchem's EquiformerV2 vs est variants, same data, steps and seeds.

Every model is trained by est's own trainer (``est.train.Trainer``, the loop
behind ``python train.py``) with the same config, data order and seed; only
``model`` differs. fairchem-core 1.10.0's EquiformerV2 enters through
``model._target_=fairchem_eqv2.trainable`` (``benchmarks/baseline``), at the
identical shape (``fairchem_eqv2.comparable_config``: 600 Gaussians, square
grid, a finite ``max_neighbors``, which the est models get too).

Models (the shape of ``eqv2-tiny``, L = 3, 2 layers, 32 channels; QM9 uses the
``qm9_quick`` reduction L = 2, m = 1):

* ``fairchem``     fairchem's EquiformerV2 (energy / direct force heads, molecules in a periodic box),
* ``est-ffn``      est's EquiformerV2 (``update="ffn"``),
* ``est-default``  est's EST block, our default preset (attention logits bounded by 4),
* ``est-paper``    the EST paper's module preset,
* ``est-spherical`` the spherical-only update (``update="spherical"``),
* ``est-uncapped`` ``est-default`` with ``model.est.logit_cap=0`` (unbounded attention logits: the
  default before v2; its runs were made as ``est-default``, the default's as ``est-capped``),
* ``est-t14``     ``est-default`` on a t-design of degree 14 (114 points instead of 146), as in
  ``study_forces.py``: whether the coarser design the bounded default tolerates holds on QM9 and EMT,
* ``est-t4`` / ``est-t8`` / ``est-t12``: the previous default (``est-hybrid0``)
  with the spherical Transformer's t-design of degree 4 / 8 / 12 (accuracy vs S on QM9);
  ``est-default-t8`` / ``est-default-t12``: the uncapped default on t = 8 / 12 instead
  of its 16 (QM9, L = 2: why the default grid has t >= 16).
* training parity, one factor at a time on ``est-ffn``: ``est-ffn-eqv2init``
  (EquiformerV2's weight initialisation), ``est-ffn-strict`` (exactly
  ``max_neighbors`` neighbours, ties broken), ``est-ffn-roll`` (random edge-frame
  roll in training), ``est-ffn-fairchem`` (all three), ``est-ffn-twin`` (all
  three, starting from the weights fairchem's model draws for the same seed, so
  the pair differs only in the code, not in the initial draw), and the control
  ``fairchem-redraw`` (fairchem with another initial draw, the seed's data
  order: how far the draw alone moves fairchem)::

      python benchmarks/study_accuracy.py --data emt --seeds 0 1 2 3 4 --root runs/parity --save-as parity \
          --models fairchem est-ffn est-ffn-eqv2init est-ffn-strict est-ffn-roll est-ffn-fairchem est-ffn-twin \
          fairchem-redraw

Data sets (both offline):

* ``qm9``: real QM9 molecules (qm9pack), ``qm9_quick``'s subset of the
  standard split (train 2,522 / val 229 / test 248; the config says how), four targets
  learned together: gap, U0 (minus atom references), mu, alpha. Test MAE.
* ``emt``: the EMT OC20-layout S2EF set (``oc20_s2ef_quick``: 800 frames,
  direct forces, lambda_E 2 / lambda_F 100). Validation energy / force MAE,
  EFwT (energy within 0.02 eV and every force component within 0.03 eV/A).

Then, per trained model on ``emt``: the equivariance of the trained EMA
weights (``est.testing.check_model``, float64, eval): largest relative force
error over random rotations of a held-out slab (jittered so that no neighbour
shell is tied at the ``max_neighbors`` cut) and of a molecule.

Each (data set, model, seed) is one subprocess with one thread, ``--jobs`` at
a time; its result goes to ``runs/accuracy/<data>/<model>-s<seed>/result.json``
and is reused on the next call (delete it, or ``--fresh``, to rerun).
Wall times of concurrent jobs share the machine: compare them within one table.

    python benchmarks/study_accuracy.py                       # both data sets, 3 seeds, 2 jobs
    python benchmarks/study_accuracy.py --data emt --models fairchem est-default --seeds 0
    python benchmarks/study_accuracy.py --quick               # smoke run (a few steps, never saved)
    python benchmarks/study_accuracy.py --tables-only         # tables from the stored runs
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "baseline"))

import fairchem_eqv2 as fe  # noqa: E402

if __name__ == "__main__":
    fe.reexec_in_baseline_env()

import common  # noqa: E402
from common import merge_runs, save, trained_rotation_error  # noqa: E402

PREVIOUS_DEFAULT = ["model.est.num_steerable_experts=1", "model.est.projections=points", "model.est.mlp_ratio=4",
                    "model.est.grid.kind=design", "model.est.grid.degree={t3}", "model.est.steerable_grid.kind=design",
                    "model.est.steerable_grid.degree={tffn}"]
#: model label -> overrides on top of the data set's experiment (the shape is the same for all)
MODELS: dict[str, list[str]] = {
    "fairchem": ["+model._target_=fairchem_eqv2.trainable"],
    # fairchem with another initial draw, the seed's data order (fairchem_eqv2.redrawn): the draw's own spread
    "fairchem-redraw": ["+model._target_=fairchem_eqv2.redrawn"],
    "est-ffn": ["model.update=ffn"],
    "est-default": ["model.update=est", "model.est.preset=default"],
    "est-paper": ["model.update=est", "model.est.preset=paper"],
    # the EST default before the irreps-projection redesign ("0"): a steerable + a spherical expert,
    # per-point LayerNorms and linears, MLP ratio 4, ST on a design of degree 3L ({t3}); "est-spherical0"
    # without the steerable expert. {t3} / {tffn} are filled in per data set from its L.
    "est-hybrid0": ["model.update=est", *PREVIOUS_DEFAULT],
    "est-spherical0": ["model.update=spherical", *PREVIOUS_DEFAULT],
    # accuracy vs S for the previous default (QM9's L = 2: t = 4 / 6 / 8 / 12 -> S = 12 / 24 / 36 / 86 points)
    "est-t4": ["model.update=est", *PREVIOUS_DEFAULT, "model.est.grid.degree=4"],
    "est-t8": ["model.update=est", *PREVIOUS_DEFAULT, "model.est.grid.degree=8"],
    "est-t12": ["model.update=est", *PREVIOUS_DEFAULT, "model.est.grid.degree=12"],
    # the (uncapped) default's grid at L = 2 before it was raised to t = 16 (S = 146), and a step between
    "est-default-t8": [*common.EST_UNCAPPED, "model.est.grid.degree=8"],
    "est-default-t12": [*common.EST_UNCAPPED, "model.est.grid.degree=12"],
    "est-uncapped": common.EST_UNCAPPED,  # the default without its bound on the attention logits
    # the default on a degree-14 design (S = 114 instead of 146), as study_forces' est-t14
    "est-t14": ["model.update=est", "model.est.preset=default", "model.est.grid.degree=14"],
    # training parity with fairchem, one factor at a time (est's EquiformerV2 + fairchem's choice)
    "est-ffn-eqv2init": ["model.update=ffn", "model.weight_init=eqv2"],
    "est-ffn-strict": ["model.update=ffn", "model.neighbor_tie_mode=strict"],
    "est-ffn-roll": ["model.update=ffn", "model.edge_roll=true"],
    "est-ffn-fairchem": ["model.update=ffn", "model.weight_init=eqv2", "model.neighbor_tie_mode=strict",
                         "model.edge_roll=true"],
    # est's model started from fairchem's initial weights of the same seed (and its data order): paired
    # with fairchem's run of that seed, only the code that computes and trains the model differs
    "est-ffn-twin": ["+model._target_=fairchem_eqv2.est_twin", "model.update=ffn", "model.neighbor_tie_mode=strict",
                     "model.edge_roll=true"],
}
#: models defined on some data sets only (the S sweep's degrees are for QM9's L = 2)
ONLY_ON: dict[str, set[str]] = {m: {"qm9"} for m in ("est-t4", "est-t8", "est-t12", "est-default-t8", "est-default-t12")}

#: data set -> experiment, shape and budget (identical for every model); reported metrics: summary.METRICS
DATASETS: dict[str, dict[str, Any]] = {
    "qm9": dict(
        experiment="qm9_quick",
        # data.atomref=b3lyp: the published runs' U0 references (the trainer's default is now "fit")
        overrides=["model=eqv2_tiny", "data.targets=[4,7,0,1]", "data.atomref=b3lyp", "model.num_targets=4", "model.lmax=2", "model.mmax=1",
                   "model.max_neighbors=12", "model.cutoff=5.0", "model.regress_energy=false", "model.regress_forces=null",
                   "model.use_pbc=false", "model.avg_num_nodes=auto", "model.avg_degree=auto",
                   "model.num_radial=600", "model.grid_resolution=[10,10]", "trainer.final_splits=[test]"],
        split="test",
        lmax=2,
    ),
    "emt": dict(
        experiment="oc20_s2ef_quick",
        # data.atomref=none: the published runs learned the referenced EMT energies directly (the default is now "fit")
        overrides=["model=eqv2_tiny", "data.atomref=none", "model.regress_forces=direct", "model.use_pbc=true", "model.cutoff=6.0",
                   "model.max_neighbors=20", "model.avg_num_nodes=auto", "model.avg_degree=auto",
                   "model.num_radial=600", "model.grid_resolution=[10,10]", "trainer.final_splits=[val]"],
        split="val",
        lmax=3,
    ),
}
QUICK = ["trainer.max_steps=4", "trainer.eval_every=4", "data.subset=200"]


def model_overrides(model: str, data: str) -> list[str]:
    """``MODELS[model]`` with ``{t3}`` / ``{tffn}`` (3L and max(3L, 18) at the data set's L) filled in."""
    L = DATASETS[data]["lmax"]
    return [o.format(t3=3 * L, tffn=max(3 * L, 18)) for o in MODELS[model]]


def run_dir(root: Path, data: str, model: str, seed: int) -> Path:
    return root / data / f"{model}-s{seed}"


# ------------------------------------------------------------------ one run (subprocess)
def train_one(data: str, model: str, seed: int, root: Path, extra: list[str]) -> dict[str, Any]:
    import torch

    from est.train import Trainer, load_config

    torch.set_num_threads(1)
    d = DATASETS[data]
    rd = run_dir(root, data, model, seed)
    cli = [f"+experiment={d['experiment']}", *d["overrides"], *model_overrides(model, data), f"seed={seed}", f"run_dir={rd}",
           "trainer.resume=never", "trainer.progress=false", "trainer.tensorboard=false", *extra]
    print(f"[accuracy] {data}/{model}/seed {seed}: python train.py {' '.join(cli)}", flush=True)
    cfg = load_config(cli)
    trainer = Trainer(cfg)
    t0 = time.perf_counter()
    status = trainer.fit()
    wall = time.perf_counter() - t0
    if status != "finished":  # SIGTERM/SIGINT: last.pt is saved, but there is no result to record
        raise SystemExit(f"[accuracy] {rd}: training interrupted at step {trainer.step}; no result written")
    tm = trainer.timing
    res = trainer.final_results.get(d["split"], {})
    record: dict[str, Any] = dict(
        data=data, model=model, seed=seed, overrides=cli, steps=trainer.step, wall_s=wall,
        ms_per_step=1000 * tm["time"] / max(tm["steps"], 1), params=sum(p.numel() for p in trainer.module.parameters()),
        split=d["split"], metrics={k: float(v) for k, v in res.items()}, model_config=trainer.model_cfg,
    )
    record["equivariance"] = trained_equivariance(trainer, rd, model, data)
    return record


def trained_equivariance(trainer, rd: Path, model: str, data: str) -> dict[str, Any]:
    """Rotation error of the trained EMA weights (float64, eval): forces on a held-out slab and a
    molecule (``emt``), the four properties of a test molecule (``qm9``, invariants)."""
    import torch

    from est.testing.check import load_model_for_check
    from est.testing.toy_models import example_molecule
    from study_equivariance_training import untied_slab

    net = load_model_for_check(checkpoint=str(rd / "best.pt"), dtype=torch.float64).eval()
    subject = fe.fairchem_callable(net) if model.startswith("fairchem") else net
    if data == "emt":
        slab, _, _ = untied_slab(trainer.datasets["val"][0], trainer.model_cfg, 0.05)
        return trained_rotation_error(subject, (("slab", slab), ("molecule", example_molecule(8))), "forces", model)
    return trained_rotation_error(subject, (("molecule", trainer.datasets["test"][0]),), "properties", model)


# ------------------------------------------------------------------ driver
def launch(jobs: list[tuple[str, str, int]], root: Path, extra: list[str], parallel: int, fresh: bool = False) -> None:
    """Run the missing (data, model, seed) jobs as subprocesses, ``parallel`` at a time."""
    common.launch(jobs, command=lambda job: [sys.executable, __file__, "--one", *map(str, job), "--root", str(root), "--extra", *extra],
                  run_dir=lambda job: run_dir(root, *job), parallel=parallel, fresh=fresh,
                  env={"EST_FAIRCHEM_REEXEC": "1"}, tag="accuracy")


def load_results(root: Path, data_sets, models, seeds) -> dict[str, dict[str, list[dict]]]:
    return common.load_results([(d, m, s) for d in data_sets for m in models for s in seeds], lambda job: run_dir(root, *job))


def tables(results: dict[str, dict[str, list[dict]]]) -> dict[str, str]:
    """Print and return the tables (``summary.accuracy_tables``: the same text the README shows)."""
    from summary import accuracy_tables

    text = accuracy_tables({"runs": results})
    for name, tbl in text.items():
        print(f"### {name}\n\n{tbl}\n", flush=True)
    return text


def fairchem_version(name: str) -> str | None:
    """fairchem-core's version here, else the one recorded in ``results/<name>.json`` (whose fairchem runs a
    merge without the baseline venv keeps)."""
    return fe.fairchem_version() or (common.load(name) or {}).get("fairchem")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    p.add_argument("--models", nargs="+", default=["fairchem", "est-ffn", "est-default"], choices=list(MODELS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (one thread each)")
    p.add_argument("--root", default=str(REPO / "runs" / "accuracy"))
    p.add_argument("--quick", action="store_true", help="smoke run: 4 steps on 200 samples (own run folder)")
    p.add_argument("--fresh", action="store_true", help="rerun jobs that already have a result")
    p.add_argument("--tables-only", action="store_true", help="no training: tables from the stored results")
    p.add_argument("--no-save", action="store_true",
                   help="do not write benchmarks/results/<--save-as>.json (--quick never does; otherwise the "
                        "runs of other models and seeds already stored there are kept)")
    p.add_argument("--save-as", default="accuracy", help="results name (benchmarks/results/NAME.json)")
    p.add_argument("--override", nargs="*", default=[], metavar="KEY=VALUE",
                   help="config overrides added to every run (use a separate --root), e.g. model.grid_resolution=[18,18]")
    p.add_argument("--one", nargs=3, metavar=("DATA", "MODEL", "SEED"), help=argparse.SUPPRESS)
    p.add_argument("--extra", nargs="*", default=[], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    os.environ.setdefault("EST_DATA_DIR", str(REPO / "runs" / "data"))  # generated data out of the source tree
    root = Path(args.root) / "quick" if args.quick else Path(args.root)

    if args.one:
        data, model, seed = args.one[0], args.one[1], int(args.one[2])
        rec = train_one(data, model, seed, root, args.extra)
        common.write_result(run_dir(root, data, model, seed), rec)
        return 0

    if not fe.available():
        print(f"[accuracy] {fe.unavailable_reason()}", flush=True)
        args.models = [m for m in args.models if not m.startswith("fairchem")]
    t0 = time.perf_counter()
    if not args.tables_only:
        jobs = [(d, m, s) for s in args.seeds for d in args.data for m in args.models
                if d in ONLY_ON.get(m, DATASETS) and (args.fresh or not (run_dir(root, d, m, s) / "result.json").exists())]
        launch(jobs, root, (QUICK if args.quick else []) + list(args.override), args.jobs, args.fresh)
    results = load_results(root, args.data, args.models, args.seeds)
    saving = bool(results) and not (args.no_save or args.quick)  # a smoke run never replaces real results
    # read, merged and written under the file's lock: a driver ending beside this one keeps its runs too
    with common.locked(common.results_file(args.save_as)) if saving else contextlib.nullcontext():
        if saving:  # runs of the other models and seeds already in <save-as>.json stay
            results = merge_runs(args.save_as, results, compatible=lambda old: old.get("overrides", []) == args.override)
        text = tables(results)
        if saving:
            seeds = sorted({r["seed"] for models in results.values() for recs in models.values() for r in recs})
            path = save(args.save_as, dict(description=__doc__.split("\n\n")[0], datasets=DATASETS, models=MODELS,
                                         seeds=seeds, wall_s=time.perf_counter() - t0,
                                         fairchem=fairchem_version(args.save_as), overrides=args.override,
                                         runs=results, tables=text))
            print(f"[accuracy] wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
