#!/usr/bin/env python
"""Study: equivariance error before and after training, end to end and per layer.

Trains three tiny backbones with the same budget, data and seed on the EMT
OC20-layout set (``+experiment=oc20_s2ef_quick``, generated on first use):

* ``eqv2-tiny``      EquiformerV2's feed-forward update (``update="ffn"``),
* ``est-tiny``       our default EST block,
* ``est-paper-tiny`` the released EST module preset (``est=dict(preset="paper")``),

then measures, in float64 and eval mode, for the initial weights (the
trainer's own initialisation, same seed) and for the trained ones (``best.pt``,
EMA weights, the weights the validation MAE is measured with):

* end to end (:func:`est.testing.check_model`, rotation check only): the
  largest relative error of the energy and of the forces over 8 random
  rotations + a 12-step local search for the worst one, on a held-out slab
  (a validation frame, periodic) and on a molecule (8 atoms, no cell);
* per layer (:func:`est.testing.check_modules`, 4 random rotations): the
  largest relative error of every submodule's ``[n, (L+1)^2, C]`` output,
  grouped by depth and kind (attention, steerable FFN experts, spherical
  experts, update-block output, heads). Errors are cumulative along the
  forward pass (a module's output carries what came in), so the module where
  the error rises most above everything before it is where it enters.

Relative errors: ``max |f(Rx) - D(R) f(x)| / max |f(x)|`` (per output, over
all atoms and degrees). Also the validation energy / force MAE of the initial
and trained weights. Prints Markdown tables; writes
``benchmarks/results/equivariance_training.json``.

Usage::

    python benchmarks/study_equivariance_training.py                   # 64 steps of 4 frames each
    python benchmarks/study_equivariance_training.py --steps 20 --no-save   # smoke run

Run directories go to ``runs/equivariance_training/<model>`` (trained from
scratch every time: ``trainer.resume=never``); the data set goes to
``$EST_DATA_DIR`` (default here: ``runs/data``, out of the source tree).
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import re
import sys
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("EST_DATA_DIR", os.path.join(REPO, "runs", "data"))

import torch  # noqa: E402

from common import print_table, save  # noqa: E402

#: (label, config overrides selecting the model); same shapes, only the update block differs
MODELS: dict[str, list[str]] = {
    "eqv2-tiny": ["model=eqv2_tiny"],
    "est-tiny": ["model=est_tiny"],
    "est-paper-tiny": ["model=est_tiny", "model.name=est-paper-tiny"],
}


def _fmt(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.1e}"


def short(name: str) -> str:
    return name.replace("backbone.", "")


def end_to_end(model, sample, *, name: str, rotations: int, refine: int) -> dict[str, Any]:
    """Rotation check of energy and forces (relative errors)."""
    from est.testing import check_model

    t0 = time.perf_counter()
    rep = check_model(model, sample, checks=["rotation"], num_rotations=rotations, refine_steps=refine, name=name)
    out: dict[str, Any] = {"seconds": time.perf_counter() - t0, "num_atoms": rep.meta["num_atoms"], "periodic": rep.meta["periodic"]}
    for output in ("energy", "forces"):
        rows = [r for r in rep.rows if r.output == output and r.expected]
        if not rows:
            continue
        worst = max(rows, key=lambda r: r.max_rel)
        out[output] = dict(max_rel=worst.max_rel, mean_rel=max(r.mean_rel for r in rows), max_abs=worst.max_abs,
                           scale=worst.scale, worst_rotation=worst.worst, ok_at_dtype_tol=all(r.ok for r in rows))
    return out


def group_of(module: str) -> tuple[int, str] | None:
    """(depth, kind) of a module name; depth -1 for the embedding, 99 for heads."""
    m = re.match(r"backbone\.(attention|update)_blocks\.(\d+)(?:\.([A-Za-z_]+))?", module.split("#")[0])
    if m:
        depth = int(m.group(2))
        if m.group(1) == "attention":
            return depth, "attn"
        sub = m.group(3)
        return depth, {None: "block", "ffns": "ffn", "spherical": "sph", "drop_path": "block"}.get(sub, sub)
    if module.startswith("energy_head"):
        return 99, "E head"
    if module.startswith("force_head"):
        return 99, "F head"
    if module.startswith("backbone.edge_degree") or module.startswith("backbone.sphere_embedding"):
        return -1, "embed"
    if module.startswith("backbone.final_norm"):
        return 98, "final norm"
    return None


def per_layer(model, sample, *, name: str, rotations: int) -> dict[str, Any]:
    """Per-module profile: largest relative error of each module, grouped by depth/kind."""
    from est.testing import check_modules

    t0 = time.perf_counter()
    rep = check_modules(model, sample, num_rotations=rotations, name=name)
    modules = []
    running = 0.0
    for mod in rep.meta["modules"]:
        rows = [r for r in rep.rows if r.output == mod]
        worst = max(rows, key=lambda r: r.max_rel)
        kind = type(model.get_submodule(mod.split("#")[0])).__name__
        jump = worst.max_rel / max(running, 1e-15)
        modules.append(dict(module=mod, type=kind, max_rel=worst.max_rel, worst_l=worst.component, jump=jump))
        running = max(running, worst.max_rel)
    groups: dict[str, float] = {}
    for m in modules:
        g = group_of(m["module"])
        if g is None:
            continue
        depth, kind = g
        key = kind if depth in (-1, 98, 99) else f"{kind} {depth}"
        groups[key] = max(groups.get(key, 0.0), m["max_rel"])
    return dict(seconds=time.perf_counter() - t0, modules=modules, groups=groups, **summarise(modules))


def summarise(modules: list[dict]) -> dict[str, dict]:
    """Worst module and the module where the error rises most above everything before it, among the
    modules whose every degree is used downstream: the energy head's FFN is left out (its l > 0
    outputs are discarded, only l = 0 is read; its error shows in the end-to-end energy error)."""
    used, running = [], 0.0
    for m in modules:
        if m["module"].startswith("energy_head"):
            continue
        used.append(dict(m, jump=m["max_rel"] - running))  # absolute rise of the running max
        running = max(running, m["max_rel"])
    worst = max(used, key=lambda m: m["max_rel"])
    enters = max(used, key=lambda m: m["jump"])
    return dict(worst=dict(module=worst["module"], type=worst["type"], max_rel=worst["max_rel"]),
                enters=dict(module=enters["module"], type=enters["type"], max_rel=enters["max_rel"], jump=enters["jump"]))


def train_one(label: str, overrides: list[str], args) -> dict[str, Any]:
    from est.testing.check import load_model_for_check
    from est.train import Trainer, build_model_from_config, load_config

    run_dir = os.path.join(args.run_root, label)
    cli = ["+experiment=oc20_s2ef_quick", *overrides, f"trainer.max_steps={args.steps}", f"run_dir={run_dir}",
           f"seed={args.seed}", "trainer.resume=never", "trainer.progress=false", "trainer.tensorboard=false",
           "trainer.final_splits=[val]", f"data.batch_size={args.batch_size}", "trainer.log_every=10"]
    if args.subset:
        cli.append(f"data.subset={args.subset}")
    cfg = load_config(cli)
    print(f"\n## {label}: python train.py {' '.join(cli)}", flush=True)
    trainer = Trainer(cfg)
    init_state = copy.deepcopy(trainer.module.state_dict())
    t0 = time.perf_counter()
    status = trainer.fit()
    train_s = time.perf_counter() - t0
    tm = trainer.timing
    record: dict[str, Any] = dict(
        overrides=cli, status=status, steps=trainer.step, epochs=trainer.epoch, train_seconds=train_s,
        ms_per_step=1000 * tm["time"] / max(tm["steps"], 1), model_config=trainer.model_cfg,
        params=sum(p.numel() for p in trainer.module.parameters()),
        val_trained={k: float(v) for k, v in trainer.final_results.get("val", {}).items()},
    )

    def init_model():
        m = build_model_from_config({"model": trainer.model_cfg})
        m.load_state_dict(init_state)
        return m

    record["val_init"] = {k: float(v) for k, v in trainer.evaluate("val", module=init_model()).items()}

    best = os.path.join(run_dir, "best.pt")
    models = {
        "init": init_model().to(torch.float64).eval(),
        "trained": load_model_for_check(checkpoint=best, dtype=torch.float64).eval(),  # EMA weights
    }
    from est.testing.toy_models import example_molecule

    val = trainer.datasets["val"]
    idx = args.slab_index % len(val)
    raw = val[idx]
    slab, jitter_seed, ties_raw = untied_slab(raw, trainer.model_cfg, args.jitter)
    samples = {"slab": slab, "molecule": example_molecule(8), "slab-ties": raw}
    record["samples"] = {
        "slab": dict(val_index=idx, num_atoms=int(raw.pos.shape[0]), jitter_A=args.jitter, jitter_seed=jitter_seed,
                     numbers=sorted(set(int(z) for z in raw.atomic_numbers.reshape(-1).tolist())),
                     note="validation frame with Gaussian noise on the positions, re-drawn until no atom has neighbours tied "
                          "(within the graph's tie_tol) with its max_neighbors-th one, so the model's radius graph is rotation invariant"),
        "slab-ties": dict(val_index=idx, tied_extra_edges=ties_raw,
                          note="the validation frame as stored: its ideal (fixed) layers have exactly tied neighbour shells at the "
                               "max_neighbors cut; end to end only, fewer rotations"),
        "molecule": "est.testing.toy_models.example_molecule(8)",
    }
    record["checks"] = {}
    for stage, model in models.items():
        for sname, sample in samples.items():
            t0 = time.perf_counter()
            ties = sname == "slab-ties"
            e2e = end_to_end(model, sample, name=f"{label}/{stage}", rotations=4 if ties else args.rotations,
                             refine=0 if ties else args.refine)
            layers = None if ties else per_layer(model, sample, name=f"{label}/{stage}", rotations=args.module_rotations)
            record["checks"][f"{stage}/{sname}"] = dict(end_to_end=e2e, per_layer=layers)
            print(f"[study] {label} {stage} {sname}: energy {_fmt(e2e.get('energy', {}).get('max_rel'))} "
                  f"forces {_fmt(e2e.get('forces', {}).get('max_rel'))}"
                  + (f" worst module {short(layers['worst']['module'])} {_fmt(layers['worst']['max_rel'])}" if layers else "")
                  + f" ({time.perf_counter() - t0:.1f}s)", flush=True)
    return record


def _tied_edges(pos, cell, cutoff, max_neighbors) -> int:
    """Edges a tie-including neighbour list adds over the strict one (0: no ties at the max_neighbors cut)."""
    from est.geometry import radius_graph

    pbc = torch.ones(3, dtype=torch.bool)
    kw = dict(cell=cell, pbc=pbc, max_neighbors=max_neighbors)
    strict = radius_graph(pos, cutoff, **kw).edge_index.shape[1]
    include = radius_graph(pos, cutoff, tie_mode="include", **kw).edge_index.shape[1]
    return include - strict


def untied_slab(data, model_cfg: dict, jitter: float):
    """A copy of ``data`` with noise on the positions and no neighbour ties at the max_neighbors cut."""
    cutoff, k = float(model_cfg["cutoff"]), model_cfg.get("max_neighbors")
    pos, cell = data.pos.double(), data.cell.reshape(3, 3).double()
    ties_raw = _tied_edges(pos, cell, cutoff, k) if k else 0
    for seed in range(100):
        g = torch.Generator().manual_seed(seed)
        new = pos + jitter * torch.randn(pos.shape, generator=g, dtype=torch.float64)
        if not k or _tied_edges(new, cell, cutoff, k) == 0:
            out = data.clone()
            out.pos = new.to(data.pos.dtype)
            return out, seed, ties_raw
    raise RuntimeError("no tie-free jitter found in 100 draws; raise --jitter")


def tables(results: dict[str, Any]) -> dict[str, str]:
    out = {}
    rows = []
    for label, rec in results.items():
        for stage in ("init", "trained"):
            val = rec[f"val_{stage}"]
            for sname in ("slab", "molecule", "slab-ties"):
                c = rec["checks"][f"{stage}/{sname}"]
                e2e = c["end_to_end"]
                layers = summarise(c["per_layer"]["modules"]) if c["per_layer"] else {
                    "worst": {"module": "-", "max_rel": None}, "enters": {"module": "-", "type": "not run"}}
                rows.append({
                    "model": label, "stage": stage,
                    "sample": f"{sname} ({e2e['num_atoms']}{'p' if e2e['periodic'] else ''})",
                    "energy rot. err": _fmt(e2e["energy"]["max_rel"]),
                    "force rot. err": _fmt(e2e["forces"]["max_rel"]),
                    "worst module": f"{short(layers['worst']['module'])} {_fmt(layers['worst']['max_rel'])}",
                    "error enters at": f"{short(layers['enters']['module'])} ({layers['enters']['type']})",
                    "val force MAE (eV/A)": f"{val['forces_mae']:.4f}" if sname == "slab" else "",
                })
    cols = ["model", "stage", "sample", "energy rot. err", "force rot. err", "worst module", "error enters at", "val force MAE (eV/A)"]
    out["end_to_end"] = print_table(rows, cols, "Equivariance before and after training (float64, eval; max relative error over rotations)")

    rows = []
    for label, rec in results.items():
        v0, v1 = rec["val_init"], rec["val_trained"]
        rows.append({"model": label, "params": f"{rec['params']:,}", "steps": rec["steps"], "train s": f"{rec['train_seconds']:.0f}",
                     "ms/step": f"{rec['ms_per_step']:.0f}",
                     "val energy MAE init / trained (eV)": f"{v0['energy_mae']:.3f} / {v1['energy_mae']:.3f}",
                     "val force MAE init / trained (eV/A)": f"{v0['forces_mae']:.4f} / {v1['forces_mae']:.4f}",
                     "mean predictor force MAE": f"{v1.get('base_forces_mae', float('nan')):.4f}"})
    out["accuracy"] = print_table(rows, list(rows[0]), "Accuracy on the validation split (same data, steps, seed)")

    rows = []
    for label, rec in results.items():
        for sname in ("slab", "molecule"):
            a, b = rec["checks"][f"init/{sname}"], rec["checks"][f"trained/{sname}"]
            ratio = lambda x, y: f"{y / x:.2g}x" if x > 0 else "-"  # noqa: E731
            rows.append({"model": label, "sample": sname,
                         "energy trained/init": ratio(a["end_to_end"]["energy"]["max_rel"], b["end_to_end"]["energy"]["max_rel"]),
                         "force trained/init": ratio(a["end_to_end"]["forces"]["max_rel"], b["end_to_end"]["forces"]["max_rel"]),
                         "worst module trained/init": ratio(summarise(a["per_layer"]["modules"])["worst"]["max_rel"],
                                                            summarise(b["per_layer"]["modules"])["worst"]["max_rel"])})
    out["growth"] = print_table(rows, list(rows[0]), "Growth of the equivariance error with training (ratio trained / init)")

    rows, keys = [], []
    for label, rec in results.items():
        for stage in ("init", "trained"):
            for sname in ("slab", "molecule"):
                g = rec["checks"][f"{stage}/{sname}"]["per_layer"]["groups"]
                keys += [k for k in g if k not in keys]
                rows.append({"model": label, "stage": stage, "sample": sname, **{k: _fmt(v) for k, v in g.items()}})
    order = lambda k: ((-1, k) if k == "embed" else (98, k) if k == "final norm" else (99, k) if "head" in k  # noqa: E731
                       else (int(k.split()[-1]), ["attn", "ffn", "sph", "block"].index(k.split()[0]) if k.split()[0] in ("attn", "ffn", "sph", "block") else 9))
    keys.sort(key=order)
    out["per_layer"] = print_table(rows, ["model", "stage", "sample", *keys],
                                   "Per layer: max relative error of the module outputs (cumulative; attn i = attention block i, "
                                   "ffn i = steerable FFN experts, sph i = spherical experts, block i = update block output)")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=64, help="optimiser steps per model")
    p.add_argument("--subset", default=None, help="data.subset (count or fraction)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--rotations", type=int, default=8, help="check_model: random rotations")
    p.add_argument("--refine", type=int, default=12, help="check_model: local-search steps around the worst rotation")
    p.add_argument("--module-rotations", type=int, default=4, help="check_modules: random rotations")
    p.add_argument("--slab-index", type=int, default=0, help="validation frame used as the held-out slab")
    p.add_argument("--jitter", type=float, default=0.05, help="std (A) of the noise that removes neighbour ties from the slab")
    p.add_argument("--batch-size", type=int, default=4, help="data.batch_size (global; the recipe's is 16)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--run-root", default=os.path.join(REPO, "runs", "equivariance_training"))
    p.add_argument("--from-json", metavar="PATH",
                   help="no training: tables (and the saved JSON) from an earlier run's partial.json or results JSON (its setup is kept)")
    p.add_argument("--no-save", action="store_true", help="do not write benchmarks/results/equivariance_training.json")
    args = p.parse_args(argv)
    from common import setup_threads

    threads = setup_threads(args.threads)
    t_start = time.perf_counter()
    results, setup = {}, None
    if args.from_json:
        with open(args.from_json) as f:
            results = json.load(f)
        if "models" in results:  # a results JSON: keep the setup of the run that measured it
            setup = dict(results["setup"], tables_regenerated_from=os.path.basename(args.from_json))
            results = results["models"]
        for rec in results.values():  # summaries follow the current rule
            for c in rec["checks"].values():
                if c["per_layer"]:
                    c["per_layer"].update(summarise(c["per_layer"]["modules"]))
    else:
        os.makedirs(args.run_root, exist_ok=True)
        for label in args.models:
            results[label] = train_one(label, MODELS[label], args)
            with open(os.path.join(args.run_root, "partial.json"), "w") as f:  # survives a crash in the tables
                json.dump(results, f, indent=1, default=str)
    text = tables(results)
    wall = time.perf_counter() - t_start
    print(f"[study] total wall time {wall / 60:.1f} min ({threads} threads)", flush=True)
    if not args.no_save:
        path = save("equivariance_training", dict(
            description=__doc__.split("\n\n")[0],
            setup=setup or dict(experiment="oc20_s2ef_quick", steps=args.steps, subset=args.subset, seed=args.seed, batch_size=args.batch_size,
                       rotations=args.rotations, refine_steps=args.refine, module_rotations=args.module_rotations,
                       dtype="float64", mode="eval", trained_weights="best.pt EMA", wall_seconds=wall,
                       relative_error="max |f(Rx) - D(R) f(x)| / max |f(x)| per output"),
            models=results, tables=text))
        print(f"[study] wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
