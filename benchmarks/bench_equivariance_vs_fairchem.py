"""Equivariance of fairchem's EquiformerV2 vs est variants at init (untrained), identical shapes.

Models (same :class:`~est.models.ModelConfig`, ``fairchem_eqv2.comparable_config``):
``fairchem`` (fairchem-core 1.10.0 EquiformerV2, molecules in a periodic box),
``fairchem-seeded`` (the same model with the RNG re-seeded before every call,
which makes each call deterministic but keeps the random roll about each edge
axis), ``est-ffn``, ``est-default``, ``est-paper``, ``est-spherical``.
Shapes: ``tiny`` (L=3, its 10x10 grid), ``tiny-g18`` (the same on the 18x18 grid
every published EquiformerV2 config uses), optionally ``small`` and ``31m``;
cutoff 6 A, 20 neighbours. Samples: ethanol (ase ``molecule``) and an OC20-like Cu(111) slab with CO
(periodic). Checks (``est.testing.check_model``): repeat (a second identical
eval call), rotation / cell rotation (random rotations + a local search for
the worst), translation, permutation, lattice shift and supercell (periodic),
reflection (informational), in float64 and float32.

fairchem draws a random vector per edge on every call to fix the roll of
the edge frame (``init_edge_rot_mat``), so two identical eval calls differ:
``repeat`` and the ``nondeterminism`` table (spread of ``--calls`` identical
calls) measure it. In float64 fairchem's graph step hard-codes float32 image
offsets, so the edges are selected on a float32 copy and the model runs in
float64 with float64 as torch's default dtype (``fairchem_eqv2.FairchemModel``).

    python benchmarks/bench_equivariance_vs_fairchem.py [--quick] [--shapes tiny small] [--dtypes float64 float32]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "baseline"))
import fairchem_eqv2 as fe  # noqa: E402

if __name__ == "__main__":
    fe.reexec_in_baseline_env()

import torch  # noqa: E402

from common import print_table, save, setup_threads  # noqa: E402

# shape key -> (registry name, overrides); "tiny-g18": the tiny shape on the published 18x18 grid
SHAPES = {
    "tiny": ("eqv2-tiny", {}),
    "tiny-g18": ("eqv2-tiny", dict(grid_resolution=(18, 18))),
    "small": ("eqv2-small", {}),
    "31m": ("equiformer_v2-31m", {}),
}
EST_VARIANTS = {
    "est-ffn": dict(update="ffn"),
    "est-default": dict(update="est", est=dict(preset="default")),
    "est-paper": dict(update="est", est=dict(preset="paper")),
    "est-spherical": dict(update="spherical"),
}
GRAPH = dict(cutoff=6.0, max_neighbors=20)


def samples():
    from ase.build import molecule

    from bench_vs_fairchem import oc20_slabs

    mol = molecule("CH3CH2OH")
    slab = oc20_slabs(1, (3, 3, 3))[0]
    return {"ethanol": mol, "Cu111+CO slab": slab}


def seeded(fn, seed: int = 0):
    """``fn`` with torch's RNG re-seeded before every call (restored afterwards)."""

    def wrapped(positions, numbers, cell, pbc):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return fn(positions, numbers, cell, pbc)

    wrapped.__name__ = fn.__name__ + "_seeded"
    return wrapped


def build_models(shape: str, dtype: torch.dtype, variants):
    """``{name: (checkable, dtype)}``; est models are est contract modules, fairchem a callable."""
    from est.models import EquiformerV2

    name, overrides = SHAPES[shape]
    cfg = fe.comparable_config(name, **{**GRAPH, **overrides})
    models, notes = {}, {}
    for v in variants:
        torch.manual_seed(0)
        try:
            if v.startswith("fairchem"):
                m = fe.FairchemModel(cfg).to(dtype).eval()
                fn = fe.fairchem_callable(m)
                models[v] = seeded(fn) if v == "fairchem-seeded" else fn
            else:
                models[v] = EquiformerV2(cfg.replace(**EST_VARIANTS[v])).to(dtype).eval()
        except Exception as err:  # noqa: BLE001 - report and go on
            notes[v] = f"build failed: {type(err).__name__}: {err}"[:140]
    return models, notes, cfg


def call(model, system, dtype):
    """One eval call on an ``est.testing.System`` through the same adapters check_model uses."""
    from est.testing import as_adapter

    return as_adapter(model, dtype=dtype)(system)


def nondeterminism(model, sample, dtype, calls: int) -> dict:
    """Max relative deviation of ``calls`` identical eval calls from the first one."""
    from est.testing import as_system

    system = as_system(sample)
    outs = [call(model, system, dtype) for _ in range(calls)]
    res = {}
    for k in ("energy", "forces"):
        ref = outs[0][k]
        scale = float(ref.abs().max())
        res[k] = max(float((o[k] - ref).abs().max()) for o in outs[1:]) / scale if scale > 0 else float("nan")
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["tiny", "tiny-g18"], choices=list(SHAPES))
    ap.add_argument("--dtypes", nargs="+", default=["float64", "float32"], choices=["float64", "float32"])
    ap.add_argument("--variants", nargs="+", default=["fairchem", "fairchem-seeded"] + list(EST_VARIANTS))
    ap.add_argument("--rotations", type=int, default=8)
    ap.add_argument("--refine", type=int, default=12)
    ap.add_argument("--calls", type=int, default=5, help="identical eval calls for the nondeterminism table")
    ap.add_argument("--quick", action="store_true", help="4 rotations, no refinement, float64 only")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    threads = setup_threads(args.threads)
    t_start = time.perf_counter()
    if args.quick:
        args.rotations, args.refine, args.dtypes = 4, 0, ["float64"]
    variants = list(args.variants)
    have_fc = fe.available()
    if not have_fc:
        print(fe.unavailable_reason(), flush=True)
        variants = [v for v in variants if not v.startswith("fairchem")]

    from est.testing import check_model

    try:  # the generic driver's per-check table, when present
        from bench_equivariance import summary_table
    except Exception:  # noqa: BLE001
        summary_table = None

    the_samples = samples()
    rows, nd_rows, reports, results = [], [], [], []
    for shape in args.shapes:
        for dname in args.dtypes:
            dtype = getattr(torch, dname)
            models, notes, cfg = build_models(shape, dtype, variants)
            for v, note in notes.items():
                rows.append(dict(shape=shape, dtype=dname, model=v, note=note))
            for v, model in models.items():
                for sname, sample in the_samples.items():
                    t0 = time.perf_counter()
                    rep = check_model(model, sample, dtype=dtype, num_rotations=args.rotations,
                                      refine_steps=args.refine, name=f"{v} {shape}")
                    sec = time.perf_counter() - t0
                    results.append((f"{v} ({shape}, {sname})", rep, sec))
                    rot = "cell_rotation" if "rotation" not in rep.checks else "rotation"
                    row = dict(shape=shape, dtype=dname, model=v, sample=sname,
                               rot_energy=rep.max_rel(rot, "energy"), rot_forces=rep.max_rel(rot, "forces"),
                               repeat=rep.max_rel("repeat"), translation=rep.max_rel("translation"),
                               permutation=rep.max_rel("permutation"))
                    if "lattice_shift" in rep.checks:
                        row["lattice_shift"] = rep.max_rel("lattice_shift")
                    sc = [c for c in rep.checks if c.startswith("supercell")]
                    if sc:
                        row["supercell"] = max(rep.max_rel(c) for c in sc)
                    row["ok"] = rep.ok
                    row["seconds"] = sec
                    rows.append(row)
                    reports.append(dict(shape=shape, dtype=dname, model=v, sample=sname, report=rep.to_dict()))
                    print(f"[{shape} {dname}] {v} on {sname}: rotation E {row['rot_energy']:.1e} F {row['rot_forces']:.1e}, "
                          f"repeat {row['repeat']:.1e} ({sec:.0f} s)", flush=True)
                    if sname != "ethanol":
                        nd = nondeterminism(model, sample, dtype, args.calls)
                        nd_rows.append(dict(shape=shape, dtype=dname, model=v, sample=sname, calls=args.calls,
                                            energy_spread=nd["energy"], forces_spread=nd["forces"],
                                            deterministic=nd["energy"] == 0 and nd["forces"] == 0))
    # ratios: fairchem's error over each est variant's (same shape, dtype, sample)
    for r in rows:
        if "rot_forces" not in r or not r["model"].startswith("est"):
            continue
        fc = next((x for x in rows if x.get("model") == "fairchem" and x.get("sample") == r["sample"]
                   and x["shape"] == r["shape"] and x["dtype"] == r["dtype"] and "rot_forces" in x), None)
        if fc:
            for k in ("rot_energy", "rot_forces"):
                r[f"fairchem/{k}"] = fc[k] / r[k] if r[k] > 0 else float("inf")
    cols = ["shape", "dtype", "model", "sample", "rot_energy", "rot_forces", "fairchem/rot_energy", "fairchem/rot_forces",
            "repeat", "translation", "permutation", "lattice_shift", "supercell", "ok", "seconds", "note"]
    tables = [print_table(rows, cols, f"Equivariance at init, max relative error (est.testing.check_model: "
                                      f"{args.rotations} random rotations + {args.refine} search steps; {threads} threads)")]
    tables.append(print_table(nd_rows, ["shape", "dtype", "model", "sample", "calls", "energy_spread", "forces_spread",
                                        "deterministic"],
                              "Nondeterminism: max relative deviation of identical eval calls from the first"))
    if summary_table is not None:
        text = summary_table(results)
        print(text)
        tables.append(text)
    name = args.out or ("vs_fairchem_equivariance" + ("_quick" if args.quick else ""))
    path = save(name, dict(rows=rows, nondeterminism=nd_rows, reports=reports, graph=GRAPH, threads=threads,
                           fairchem=fe.fairchem_version() if have_fc else None,
                           baseline_note=None if have_fc else fe.unavailable_reason(),
                           wall_s=time.perf_counter() - t_start, tables=tables))
    print(f"wrote {path} ({time.perf_counter() - t_start:.0f} s)")


if __name__ == "__main__":
    main()
