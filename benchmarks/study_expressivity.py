"""Expressivity study: est's layers vs an e3nn tensor-product model on the
synthetic tasks of :mod:`est.testing.expressivity` (resumable).

Rows: EquiformerV2 (``update="ffn"``), the EST default block (and without its
logit cap, the default before v2), the EST paper preset, spherical experts only,
an e3nn TFN/NequIP-style model, and MACE (correlation 3: many-body messages in
one layer; ``benchmarks/baseline/mace_expressivity.py`` in the MACE venv, the
same training loop; ``kchain`` and counterexamples only, since one MACE layer
outputs scalars only); all one layer unless the task varies depth, same width
``--channels``.

* ``rotsym``: L = 1..6 x fold in {2, 3, 5, 10}, equivariant readout;
* ``kchain`` (k = 4): layers 1..k+1 at L = ``--kchain-lmax``, invariant readout;
* ``counterexample``: body order 2 / 3 / 4 (chiral), one layer, invariant
  readout, at L = ``--counter-lmax``;
* equivariance of each model's pooled features on the rotsym graphs (float64,
  at initialisation): is a "success" where exact models must fail an artefact?
* separation at initialisation of every cell (float64, 3 seeds,
  :func:`est.testing.expressivity.separation`; ``expressivity_separation.json``):
  the relative difference of the two classes' logits next to the rotation
  floor. Round-off means the architecture cannot separate the pair; a value
  well above the floor means it can, and training decides the rest.

Protocol: :func:`est.testing.expressivity.train_classifier` (Adam lr 1e-4,
100 epochs, fresh weights per seed). Each (cell, seed) is one job; results go
to ``benchmarks/results/expressivity.json`` after every job, so a killed run
resumes where it stopped. Seeds are run in passes (``--seed-passes``), so a
short sitting gives a complete table with fewer seeds first.

    python benchmarks/study_expressivity.py --workers 2          # the full study
    python benchmarks/study_expressivity.py --table              # print the tables only
    python benchmarks/study_expressivity.py --separation-only    # the separation pass only (minutes)
    python benchmarks/study_expressivity.py --only "rotsym[fold=10]|EST default|L=6"   # one cell
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "baseline"))
import mace_baseline as mb  # noqa: E402
from common import RESULTS, locked, markdown_table, print_table  # noqa: E402

from est.data.cache import atomic_text  # noqa: E402

OUT = RESULTS / "expressivity.json"
#: separation at initialisation per cell (a file of its own: a training run in progress rewrites OUT)
SEPARATION_OUT = RESULTS / "expressivity_separation.json"
SEPARATION_SEEDS = 3


def _previous_default(experts: int):
    """The EST default before the irreps-projection redesign: per-point LayerNorms and linears, MLP ratio 4,
    spherical Transformer on a design of degree 3L, ``experts`` steerable (FFN) experts."""
    return lambda L: dict(num_steerable_experts=experts, projections="points", mlp_ratio=4,
                          grid=dict(kind="design", degree=3 * L), steerable_grid=dict(kind="design", degree=max(3 * L, 18)))


UNCAPPED = "EST default, uncapped (v1)"
MODELS = {
    "eqv2 (ffn)": dict(kind="est", update="ffn", preset="default"),
    "EST default": dict(kind="est", update="est", preset="default"),
    # the default before model defaults v2 (no bound on the attention logits): its cells were run as "EST default"
    UNCAPPED: dict(kind="est", update="est", preset="default", est=lambda L: dict(logit_cap=0)),
    "EST paper": dict(kind="est", update="est", preset="paper"),
    "EST hybrid (previous default)": dict(kind="est", update="est", preset="default", est=_previous_default(1)),
    "spherical only (previous, per-point)": dict(kind="est", update="spherical", preset="default",
                                                 est=_previous_default(0)),
    "e3nn TP": dict(kind="tp"),
    "MACE (correlation 3)": dict(kind="mace", correlation=3),
}
#: runs in the MACE venv (``mace_baseline.run_in_venv``); invariant-readout tasks only
MACE_SCRIPT = Path(__file__).resolve().parent / "baseline" / "mace_expressivity.py"
FOLDS = (2, 3, 5, 10)
LMAXES = (1, 2, 3, 4, 5, 6)


def in_venv(model: str) -> bool:
    """True for a row that runs in the MACE venv: no rotsym cells (one MACE layer outputs scalars only),
    no equivariance-at-init column (its features are not est's layout)."""
    return MODELS[model]["kind"] == "mace"


def geometry(task) -> dict:
    """The classifiers' normalisation and cutoff for ``task``'s graphs (the same for every row)."""
    return dict(avg_degree=task.mean_degree, cutoff=max(2.0, 1.5 * task.max_edge_length))


def build(model: str, *, lmax: int, num_layers: int, readout: str, channels: int, task):
    from est.testing.expressivity import est_classifier, tensor_product_classifier

    spec = MODELS[model]
    common = dict(lmax=lmax, num_layers=num_layers, readout=readout, channels=channels, **geometry(task))
    if spec["kind"] == "tp":
        return tensor_product_classifier(**common)
    est = spec["est"](lmax) if "est" in spec else None
    return est_classifier(update=spec["update"], preset=spec["preset"], est=est, **common)


TASKS = ("counterexample", "kchain", "rotsym")


def cells(args) -> list[dict]:
    """Every (task, model) cell; models vary fastest, so a partial run covers all rows evenly."""
    out = []
    tasks = set(getattr(args, "tasks", None) or TASKS)
    for params in (dict(body=2), dict(body=3), dict(body=4, chiral=True)):
        out += [dict(task="counterexample", params=params, model=m, lmax=args.counter_lmax, layers=1)
                for m in args.models]
    for layers in range(1, args.kchain_k + 2):
        out += [dict(task="kchain", params=dict(k=args.kchain_k), model=m, lmax=args.kchain_lmax, layers=layers)
                for m in args.models]
    for L in LMAXES:
        for fold in FOLDS:
            out += [dict(task="rotsym", params=dict(fold=fold), model=m, lmax=L, layers=1) for m in args.models]
    return [c for c in out if c["task"] in tasks and not (c["task"] == "rotsym" and in_venv(c["model"]))]


def key(cell: dict) -> str:
    p = ",".join(f"{k}={v}" for k, v in sorted(cell["params"].items()))
    return f"{cell['task']}[{p}]|{cell['model']}|L={cell['lmax']}|layers={cell['layers']}"


def _mace(command: str, cell: dict, channels: int, *args) -> dict:
    """``mace_expressivity.py COMMAND`` on ``cell``'s task graphs, in the MACE venv."""
    import tempfile

    from est.testing.expressivity import make_task

    task = make_task(cell["task"], **cell["params"])
    g = geometry(task)
    graphs = [dict(pos=x.pos.double().tolist(), atomic_numbers=x.atomic_numbers.view(-1).tolist(),
                   edge_index=x.edge_index.tolist(), y=int(x.y)) for x in task.graphs]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "task.json"
        path.write_text(json.dumps(dict(graphs=graphs, num_classes=task.num_classes, mean_degree=g["avg_degree"],
                                        cutoff=g["cutoff"])))
        return mb.run_in_venv(command, "--task", path, "--lmax", cell["lmax"], "--layers", cell["layers"],
                              "--channels", channels, "--correlation", MODELS[cell["model"]]["correlation"], *args,
                              script=MACE_SCRIPT)


def run_job(cell: dict, seed: int, channels: int, epochs: int, lr: float) -> dict:
    torch.set_num_threads(1)
    from est.testing.expressivity import make_task, train_classifier

    if in_venv(cell["model"]):
        return _mace("train", cell, channels, "--seed", seed, "--epochs", epochs, "--lr", lr)
    task = make_task(cell["task"], **cell["params"])
    t0 = time.perf_counter()
    res = train_classifier(
        lambda: build(cell["model"], lmax=cell["lmax"], num_layers=cell["layers"], readout=task.readout,
                      channels=channels, task=task),
        task, seeds=[seed], epochs=epochs, lr=lr,
    )
    return dict(seed=seed, accuracy=res["per_seed"][0], final=res["final_per_seed"][0],
                seconds=time.perf_counter() - t0)


def equivariance_error(model_name: str, *, lmax: int, fold: int, channels: int, rotations: int = 4) -> float:
    """max over rotations of ||f(RG) - D(R) f(G)|| / ||f(G)|| for the pooled features (float64, init, eval)."""
    from torch_geometric.data import Batch

    from est.so3 import random_rotation, wigner_D
    from est.testing import default_dtype
    from est.testing.expressivity import make_task

    torch.manual_seed(0)
    task = make_task("rotsym", fold=fold)
    with default_dtype(torch.float64):  # e3nn builds its coupling tables in the default dtype
        model = build(model_name, lmax=lmax, num_layers=1, readout="equivariant", channels=channels, task=task)
    model = model.double().eval()
    gen = torch.Generator().manual_seed(1)
    worst = 0.0
    with torch.no_grad():
        for g in task.graphs:
            b = Batch.from_data_list([g])
            f = model.features(b).sum(0)  # [K, C] or [dim]
            for _ in range(rotations):
                R = random_rotation(1, dtype=torch.float64, generator=gen)[0]  # [3, 3]
                rb = b.clone()
                rb.pos = b.pos @ R.T
                fr = model.features(rb).sum(0)
                D = wigner_D(lmax, R)  # [K, K], block diagonal in l
                if MODELS[model_name]["kind"] == "tp":  # e3nn layout: (mul, 2l+1) blocks
                    D = torch.block_diag(*[
                        torch.kron(torch.eye(mul, dtype=R.dtype), D[ir.l ** 2:(ir.l + 1) ** 2, ir.l ** 2:(ir.l + 1) ** 2])
                        for mul, ir in model.irreps_out
                    ])
                ref = D @ f
                worst = max(worst, float((fr - ref).norm() / f.norm()))
    return worst


def cell_separation(cell: dict, channels: int, seeds: int = SEPARATION_SEEDS) -> dict:
    """:func:`est.testing.expressivity.separation` of one cell's model at initialisation (float64)."""
    from est.testing.expressivity import make_task, separation

    if in_venv(cell["model"]):
        return _mace("separation", cell, channels, "--seeds", seeds)
    task = make_task(cell["task"], **cell["params"])
    res = separation(lambda: build(cell["model"], lmax=cell["lmax"], num_layers=cell["layers"], readout=task.readout,
                                   channels=channels, task=task), task, seeds=seeds)
    return {k: res[k] for k in ("per_seed", "floor_per_seed", "seeds")}


def separation_pass(cells_: list[dict], channels: int, path: Path) -> dict:
    """Separation of every cell not yet in ``path`` (resumable; saved after each cell)."""
    def empty() -> dict:
        return dict(config=dict(channels=channels), cells={})

    sep = update(path, lambda d: None, empty=empty)
    if sep["config"] != dict(channels=channels):
        sys.exit(f"{path} was made with {sep['config']}; pass the same --channels or move the file away")
    todo = [c for c in cells_ if key(c) not in sep["cells"]]
    for i, c in enumerate(todo, 1):
        entry = cell_separation(c, channels)
        sep = update(path, lambda d: d["cells"].setdefault(key(c), entry), empty=empty)
        if i % 20 == 0:
            print(f"  separation {i}/{len(todo)}", flush=True)
    return sep


def empty_study() -> dict:
    return dict(cells={}, equivariance={}, config={})


def load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else empty_study()


def save(data: dict, path: Path) -> None:
    atomic_text(path, json.dumps(data, indent=1))


def update(path: Path, change, *, empty=empty_study) -> dict:
    """Re-read the JSON at ``path`` (``empty()`` if none), apply ``change(data)``, save it atomically; the data.

    Under an exclusive lock on ``.<name>.lock`` beside it, so drivers run side by side (say one per
    ``--models``) add their results without overwriting each other's.
    """
    with locked(path):
        data = json.loads(path.read_text()) if path.exists() else empty()
        change(data)
        save(data, path)
    return data


def add_run(data: dict, cell: dict, run: dict) -> None:
    """Add one seed's ``run`` to ``cell``'s entry in the study's ``data`` (a seed already there is kept)."""
    entry = data["cells"].setdefault(key(cell), dict(cell=cell, runs=[]))
    if all(r["seed"] != run["seed"] for r in entry["runs"]):
        entry["runs"].append(run)
        entry["runs"].sort(key=lambda r: r["seed"])


def summary(entry: dict) -> tuple[float, float, int]:
    acc = [r["accuracy"] for r in entry["runs"]]
    if not acc:
        return math.nan, math.nan, 0
    m = sum(acc) / len(acc)
    return m, math.sqrt(sum((a - m) ** 2 for a in acc) / len(acc)), len(acc)


def fmt(entry: dict | None) -> str:
    if not entry or not entry["runs"]:
        return "-"
    m, s, n = summary(entry)
    return f"{m:.0f} ± {s:.0f}" + ("" if n >= 10 else f" (n={n})")


def fmt_separation(entry: dict | None) -> str:
    """``d_min..d_max`` over seeds, then the rotation floor (its max) where the readout is invariant."""
    if not entry:
        return "-"
    d, floor = entry["per_seed"], entry.get("floor_per_seed")
    text = f"{min(d):.0e}" if len(d) == 1 else f"{min(d):.0e}..{max(d):.0e}"
    return text + (f"; floor {max(floor):.0e}" if floor else "")


def separation_tables(sep: dict, data_config: dict, models: list[str]) -> dict[str, tuple[list[dict], list[str], str]]:
    """Rows, columns and title of the separation tables (``rotsym``: the extremes on each side of the degree cap)."""
    cells_ = sep["cells"]

    def find(task, params, model, L, layers):
        return cells_.get(key(dict(task=task, params=params, model=model, lmax=L, layers=layers)))

    models = [m for m in models if any(k.split("|")[1] == m for k in cells_)]
    out = {}
    rows = []
    for model in [m for m in models if not in_venv(m)]:  # no rotsym cells
        below, above = [], []
        for L in LMAXES:
            for fold in FOLDS:
                e = find("rotsym", dict(fold=fold), model, L, 1)
                if e:
                    (below if L < fold else above).append((max(e["per_seed"]) if L < fold else min(e["per_seed"]),
                                                           f"L={L}, fold {fold}"))
        rows.append({"model": model,
                     "L < k: largest d (cell)": f"{max(below)[0]:.0e} ({max(below)[1]})" if below else "-",
                     "L >= k: smallest d (cell)": f"{min(above)[0]:.0e} ({min(above)[1]})" if above else "-",
                     "cells": f"{len(below)} + {len(above)}"})
    out["rotsym-separation"] = (rows, ["model", "L < k: largest d (cell)", "L >= k: smallest d (cell)", "cells"],
                                "rotsym: separation d of the two orientations at initialisation (float64, "
                                f"{SEPARATION_SEEDS} seeds), below and above the degree cap")
    k, kL = data_config.get("kchain_k", 4), data_config.get("kchain_lmax", 2)
    rows = [{"model": model, **{f"{n} layers": fmt_separation(find("kchain", dict(k=k), model, kL, n))
                                for n in range(1, k + 2)}} for model in models]
    out["kchain-separation"] = (rows, ["model"] + [f"{n} layers" for n in range(1, k + 2)],
                                f"kchain (k={k}, L={kL}): separation d at initialisation and rotation floor")
    L = data_config.get("counter_lmax", 4)
    bodies = {"2-body": dict(body=2), "3-body": dict(body=3), "4-body chiral": dict(body=4, chiral=True)}
    rows = [{"model": model, **{name: fmt_separation(find("counterexample", params, model, L, 1))
                                for name, params in bodies.items()}} for model in models]
    out["counterexample-separation"] = (rows, ["model", *bodies],
                                        f"counterexamples (one layer, L={L}): separation d at initialisation and rotation floor")
    return out


def tables(data: dict, *, echo: bool = True, separation: dict | None = None) -> dict[str, str]:
    """Markdown tables ``{"rotsym", "kchain", "counterexample"}`` from the study's JSON, and with
    ``separation`` (``expressivity_separation.json``) ``{"rotsym-separation", ...}``."""
    def table(rows, cols, title):
        return print_table(rows, cols, title) if echo else markdown_table(rows, cols)

    cells_ = data["cells"]
    models = [m for m in MODELS if any(e["cell"]["model"] == m for e in cells_.values())]
    out = {}

    def find(task, params, model, L, layers):
        return cells_.get(key(dict(task=task, params=params, model=model, lmax=L, layers=layers)))

    rows = []
    for model in [m for m in models if not in_venv(m)]:  # no rotsym cells
        for L in LMAXES:
            row = {"model": model, "L": L}
            for fold in FOLDS:
                row[f"fold {fold}"] = fmt(find("rotsym", dict(fold=fold), model, L, 1))
            eq = data["equivariance"].get(f"{model}|L={L}")
            row["equiv. error (init)"] = f"{eq:.1e}" if eq is not None else "-"
            rows.append(row)
    out["rotsym"] = table(rows, ["model", "L"] + [f"fold {f}" for f in FOLDS] + ["equiv. error (init)"],
                          "rotsym: accuracy (%) of one layer, equivariant readout, mean ± std over seeds")
    cfg = data.get("config", {})
    k = cfg.get("kchain_k", 4)
    rows = []
    for model in models:
        row = {"model": model}
        for layers in range(1, k + 2):
            row[f"{layers} layers"] = fmt(find("kchain", dict(k=k), model, cfg.get("kchain_lmax", 2), layers))
        rows.append(row)
    out["kchain"] = table(rows, ["model"] + [f"{n} layers" for n in range(1, k + 2)],
                          f"kchain (k={k}, L={cfg.get('kchain_lmax', 2)}): accuracy (%), invariant readout")
    rows = []
    L = cfg.get("counter_lmax", 4)
    for model in models:
        rows.append({
            "model": model,
            "2-body": fmt(find("counterexample", dict(body=2), model, L, 1)),
            "3-body": fmt(find("counterexample", dict(body=3), model, L, 1)),
            "4-body chiral": fmt(find("counterexample", dict(body=4, chiral=True), model, L, 1)),
        })
    out["counterexample"] = table(rows, ["model", "2-body", "3-body", "4-body chiral"],
                                  f"counterexamples (one layer, L={L}): accuracy (%), invariant readout")
    if separation:
        for name, (rows, cols, title) in separation_tables(separation, cfg, list(MODELS)).items():
            out[name] = table(rows, cols, title)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=[m for m in MODELS if m != UNCAPPED], choices=list(MODELS),
                    help=f"default: every model but {UNCAPPED!r} (run only when named)")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--seed-passes", type=int, nargs="+", default=[3, 10],
                    help="run seeds 0..a-1 for every cell, then up to b, ...")
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--channels", type=int, default=16)
    ap.add_argument("--kchain-k", type=int, default=4)
    ap.add_argument("--kchain-lmax", type=int, default=2)
    ap.add_argument("--counter-lmax", type=int, default=4)
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS),
                    help="run only these tasks' cells (the JSON keeps every task's results)")
    ap.add_argument("--only", nargs="+", default=None, metavar="TEXT",
                    help="run only the cells whose key contains one of these texts, e.g. "
                         "'rotsym[fold=10]|EST default|L=6' (the JSON keeps every cell)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--table", action="store_true", help="print the tables from the JSON and exit")
    ap.add_argument("--separation-only", action="store_true",
                    help="compute the missing separation entries of the selected cells, print, exit (no training)")
    args = ap.parse_args()
    data = load(args.out)
    sep_path = SEPARATION_OUT if args.out == OUT else args.out.with_name(args.out.stem + "_separation.json")
    if args.table:
        tables(data, separation=json.loads(sep_path.read_text()) if sep_path.exists() else None)
        return
    config = dict(epochs=args.epochs, lr=args.lr, channels=args.channels, kchain_k=args.kchain_k,
                  kchain_lmax=args.kchain_lmax, counter_lmax=args.counter_lmax)
    if data["config"] and data["config"] != config:
        sys.exit(f"{args.out} was made with {data['config']}; pass the same options or move the file away")
    data = update(args.out, lambda d: d.update(config=config))
    torch.set_num_threads(1)
    if any(map(in_venv, args.models)) and not mb.available():
        print(f"[expressivity] {mb.MISSING}", flush=True)
        args.models = [m for m in args.models if not in_venv(m)]
    for model in [m for m in args.models if not in_venv(m)]:  # cheap: equivariance at init
        for L in LMAXES:
            k = f"{model}|L={L}"
            if k not in data["equivariance"]:
                err = equivariance_error(model, lmax=L, fold=max(2, L), channels=args.channels)
                data = update(args.out, lambda d: d["equivariance"].setdefault(k, err))
    all_cells = [c for c in cells(args) if not args.only or any(t in key(c) for t in args.only)]
    sep = separation_pass(all_cells, args.channels, sep_path)  # cheap: forward passes at init
    if args.separation_only:
        tables(data, separation=sep)
        return
    passes = sorted(set(min(p, args.seeds) for p in args.seed_passes) | {args.seeds})
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for upto in passes:
            jobs = {}
            for c in all_cells:
                done = {r["seed"] for r in data["cells"].get(key(c), {}).get("runs", [])}
                for seed in range(upto):
                    if seed not in done:
                        fut = pool.submit(run_job, c, seed, args.channels, args.epochs, args.lr)
                        jobs[fut] = c
            print(f"pass up to {upto} seeds: {len(jobs)} jobs", flush=True)
            for i, fut in enumerate(as_completed(jobs), 1):
                run = fut.result()
                data = update(args.out, lambda d: add_run(d, jobs[fut], run))
                if i % 20 == 0:
                    print(f"  {i}/{len(jobs)} done", flush=True)
    tables(data, separation=sep)


if __name__ == "__main__":
    main()
