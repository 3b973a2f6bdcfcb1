"""MD and relaxation through ASE: gradient vs direct forces on the EMT OC20-layout set.

Steps (all on CPU, about 5-8 minutes on 2 cores with the defaults):

1. generate a small EMT set (``est.data.generate``: Cu/Pt (111)/(100) slabs with
   H, O, OH, CO, N adsorbates) into a temporary folder;
2. train two tiny EST models (``est-tiny`` shrunk to 1 layer, L=2, C=16, cutoff 5 A,
   ``est-tiny``, cutoff 5 A, all neighbours) with the
   same budget (steps, batch, LR, loss weights) through ``est.train.Trainer``:
   ``regress_forces=gradient`` (F = -dE/dx) and ``regress_forces=direct``
   (EquiformerV2's force head);
3. (a) NVE: ``ase.md.VelocityVerlet`` (1 fs, start at the EMT-relaxed
   structure with 300 K Maxwell-Boltzmann velocities, sub-surface atoms fixed)
   on a few validation slabs with each model and with EMT itself; drift =
   slope of a linear fit of the total energy, in meV per atom per ps, and the
   max |E_tot(t) - E_tot(0)|;
   (b) ``ase.optimize.BFGS`` (fmax 0.05 eV/A) from the initial validation
   structures with each model and with EMT: energy difference of the final
   energies (model's own vs EMT's, both referenced as the training data),
   EMT energy at the model's minimum minus EMT's minimum, RMSD of the free
   atoms' relaxed positions (minimum image), optimiser steps;
   (c) why a gradient-force model can still drift: the energy along a straight
   path of the adsorbate, the largest energy step where the radius graph changes
   (a neighbour crossing the cutoff) against the median step, and the mismatch
   of the line integral of the forces.

    python benchmarks/study_md_ase.py [--steps 150 --md-steps 200 --systems 3]

Writes ``benchmarks/results/md_ase.json`` and prints Markdown tables. Numbers
from a few minutes of training are about the method, not about accuracy.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import print_table, save, setup_threads  # noqa: E402


#: est-tiny shrunk to one layer, L=2, C=16 (a gradient-force step on 2 busy cores is seconds)
MICRO = {"num_layers": 1, "lmax": 2, "mmax": 2, "channels": 16, "attn_hidden_channels": 16, "attn_alpha_channels": 8,
         "attn_value_channels": 8, "ffn_hidden_channels": 32, "edge_channels": 16, "num_radial": 16,
         "grid_resolution": "[8,7]"}


def make_dataset(out: str, frames: int, seed: int) -> str:
    from est.data.generate import generate

    generate(out, frames=frames, seed=seed, workers=1, metals=("Cu", "Pt"), facets=("111", "100"),
             adsorbates=("H", "O", "OH", "CO", "N"), md_frames=12, relax_frames=8, val_fraction=0.34, verbose=False)
    return out


def train(data: str, run_dir: str, forces: str, steps: int, batch: int, seed: int, lr: float = 1e-3) -> tuple[str, float]:
    from est.train import Trainer, load_config

    cfg = load_config([
        "+experiment=oc20_s2ef_quick", f"run_dir={run_dir}", f"seed={seed}",
        "data.generate=false", f"data.train_path={data}/s2ef/train", f"data.val_path={data}/s2ef/val",
        f"data.batch_size={batch}", "data.eval_batch_size=32",
        f"model.regress_forces={forces}", "model.cutoff=5.0", "model.max_neighbors=null",
        # smooth cutoff: without it the energy jumps when a neighbour crosses the cutoff
        # (the results in benchmarks/results/md_ase.json were measured before this line, envelope=None)
        "model.envelope=polynomial",
        *[f"model.{k}={v}" for k, v in MICRO.items()],
        "trainer.max_epochs=1000", f"trainer.max_steps={steps}", f"trainer.eval_every={steps}",
        f"trainer.lr={lr}", "trainer.warmup_steps=10", "trainer.device=cpu", "trainer.progress=false",
        "trainer.tensorboard=false", "trainer.plots=false", "trainer.log_every=50", "trainer.ema_decay=0.99",
        "trainer.resume=never", "trainer.final_splits=[val]",
    ])
    t0 = time.time()
    tr = Trainer(cfg)
    if tr.fit() != "finished":
        raise SystemExit(f"[md_ase] {run_dir}: training interrupted at step {tr.step}")
    return os.path.join(run_dir, "best.pt"), time.time() - t0


def val_systems(data: str, n: int, max_atoms: int):
    """The first ``n`` validation IS2RE records with at most ``max_atoms`` atoms as ase.Atoms (initial, relaxed)."""
    from ase import Atoms
    from ase.constraints import FixAtoms

    from est.data import LmdbDataset

    ds = LmdbDataset(os.path.join(data, "is2re", "val", "data.lmdb"), extra_fields=("pos_relaxed", "y_init"))
    out = []
    for i in range(len(ds)):
        s = ds[i]
        if int(s.natoms) > max_atoms:
            continue
        mk = lambda pos: Atoms(numbers=s.atomic_numbers.numpy(), positions=pos.double().numpy(),  # noqa: E731
                               cell=s.cell.reshape(3, 3).double().numpy(), pbc=s.pbc.reshape(3).numpy(),
                               tags=s.tags.numpy(), constraint=FixAtoms(mask=s.fixed.numpy().astype(bool)))
        out.append({"sid": int(s.sid), "init": mk(s.pos), "relaxed": mk(s.pos_relaxed),
                    "y_init": float(s.y_init), "formula": mk(s.pos).get_chemical_formula()})
        if len(out) == n:
            break
    return out


def emt_offset(sysd) -> float:
    """E_EMT - E_referenced for this system (the clean slab + gas references of the data set)."""
    from ase.calculators.emt import EMT

    a = sysd["init"].copy()
    a.calc = EMT()
    return float(a.get_potential_energy()) - sysd["y_init"]


def nve(atoms, calc, steps: int, seed: int, offset: float = 0.0):
    from ase import units
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution
    from ase.md.verlet import VelocityVerlet

    a = atoms.copy()
    a.calc = calc
    MaxwellBoltzmannDistribution(a, temperature_K=300.0, rng=np.random.RandomState(seed))
    mom = a.get_momenta()
    if a.constraints:
        mom[a.constraints[0].get_indices()] = 0.0  # fixed sub-surface atoms stay at rest
    a.set_momenta(mom, apply_constraint=False)
    md = VelocityVerlet(a, timestep=1.0 * units.fs)
    etot = []
    md.attach(lambda: etot.append(a.get_potential_energy() + a.get_kinetic_energy()), interval=1)
    t0 = time.time()
    failed = ""
    try:
        md.run(steps)
    except ValueError as exc:  # UnsupportedStructureError: atoms overlapped / blew up
        failed = f"stopped at step {len(etot)}: {str(exc)[:80]}"
    e = np.asarray(etot) - offset
    t_ps = np.arange(len(e)) * 1e-3
    slope = np.polyfit(t_ps, e, 1)[0] if len(e) > 2 else float("nan")
    return {"drift_meV_atom_ps": 1000.0 * slope / len(a), "max_dev_meV_atom": 1000.0 * float(np.abs(e - e[0]).max()) / len(a),
            "T_end_K": float(a.get_temperature()), "steps": len(e) - 1, "seconds": time.time() - t0, "failed": failed}


def relax(atoms, calc, fmax: float, steps: int):
    from ase.optimize import BFGS

    a = atoms.copy()
    a.calc = calc
    opt = BFGS(a, logfile=None)
    t0 = time.time()
    converged = bool(opt.run(fmax=fmax, steps=steps))
    return a, {"steps": int(opt.get_number_of_steps()), "converged": converged, "seconds": time.time() - t0,
               "energy": float(a.get_potential_energy())}


def cutoff_continuity(atoms, calc, cutoff: float, n: int = 120):
    """Move the last (adsorbate) atom along a straight 1.5 A path: the largest energy step at a change of the
    radius graph vs the median step, and the line-integral mismatch |dE + integral F.dx| (0 for a smooth
    conservative model). Positions along the path move by 1.5/n A per step."""
    from est.geometry import radius_graph

    a = atoms.copy()
    a.set_constraint()
    i = len(a) - 1
    d = np.array([0.7, 0.5, 1.2])
    energies, work, fprev, edges = [], 0.0, None, []
    for k in range(n + 1):
        b = a.copy()
        b.positions[i] += d * k / n
        r = calc.predict_batch([b])[0]
        energies.append(r["energy"])
        f = r["forces"][i]
        if fprev is not None:
            work += 0.5 * float((f + fprev) @ (d / n))
        fprev = f
        g = radius_graph(torch.as_tensor(b.positions), cutoff, cell=torch.as_tensor(b.cell.array).view(1, 3, 3),
                         pbc=torch.as_tensor(b.pbc).view(1, 3))
        edges.append(int(g.edge_index.shape[1]))
    steps = np.abs(np.diff(energies))
    change = np.diff(edges) != 0
    return {"graph_changes": int(change.sum()), "max_step_at_graph_change_eV": float(steps[change].max()) if change.any() else 0.0,
            "median_step_eV": float(np.median(steps)), "line_integral_mismatch_eV": abs(energies[-1] - energies[0] + work)}


def rmsd_free(a, b) -> float:
    from ase.geometry import find_mic

    free = np.ones(len(a), dtype=bool)
    if a.constraints:
        free[a.constraints[0].get_indices()] = False
    d, _ = find_mic(a.positions[free] - b.positions[free], a.cell, a.pbc)
    return float(np.sqrt((d ** 2).sum(axis=1).mean()))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=300)
    p.add_argument("--steps", type=int, default=60, help="training steps per model (same budget for both)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--float64", action="store_true", help="evaluate the trained models in float64 for MD/relaxation")
    p.add_argument("--systems", type=int, default=2)
    p.add_argument("--max-atoms", type=int, default=20)
    p.add_argument("--md-steps", type=int, default=100, help="VelocityVerlet steps of 1 fs")
    p.add_argument("--relax-steps", type=int, default=40)
    p.add_argument("--fmax", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default=None)
    p.add_argument("--reuse", action="store_true", help="reuse trained runs in --workdir (train_s: the trainer's time in its steps)")
    p.add_argument("--name", default="md_ase")
    args = p.parse_args(argv)
    threads = setup_threads()
    from ase.calculators.emt import EMT

    from est.calculators import ESTCalculator

    t_start = time.time()
    work = args.workdir or tempfile.mkdtemp(prefix="est-md-study-")
    data = os.path.join(work, "emt")
    t0 = time.time()
    if not os.path.isfile(os.path.join(data, "manifest.json")):
        make_dataset(data, args.frames, args.seed)
    t_data = time.time() - t0
    print(f"[study] data {data} ({t_data:.0f} s)", flush=True)

    models, train_rows = {}, []
    for forces in ("gradient", "direct"):
        run_dir = os.path.join(work, f"run_{forces}")
        if args.reuse and os.path.isfile(os.path.join(run_dir, "final_metrics.json")):
            ck = os.path.join(run_dir, "best.pt")
            with open(os.path.join(run_dir, "final_metrics.json")) as fh:  # the trainer's own step time
                secs = float((json.load(fh).get("timing") or {}).get("time", float("nan")))
        else:
            ck, secs = train(data, run_dir, forces, args.steps, args.batch, args.seed, args.lr)
        calc = ESTCalculator.from_checkpoint(ck, dtype=torch.float64 if args.float64 else torch.float32)
        with open(os.path.join(work, f"run_{forces}", "final_metrics.json")) as fh:
            fm = json.load(fh)["results"]["val"]
        models[forces] = calc
        train_rows.append({"forces": forces, "train_steps": args.steps, "batch": args.batch, "train_s": round(secs, 1),
                           "val_energy_mae_eV": fm["energy_mae"], "val_forces_mae_eV_A": fm["forces_mae"],
                           "base_forces_mae_eV_A": fm["base_forces_mae"]})
        print(f"[study] trained {forces} in {secs:.0f} s: {train_rows[-1]}", flush=True)

    systems = val_systems(data, args.systems, args.max_atoms)
    md_rows, relax_rows = [], []
    for k, s in enumerate(systems):
        off = emt_offset(s)
        calcs = {"EMT (reference)": (EMT(), off), "EST gradient": (models["gradient"], 0.0), "EST direct": (models["direct"], 0.0)}
        for label, (calc, offset) in calcs.items():
            r = nve(s["relaxed"], calc, args.md_steps, seed=args.seed + k, offset=offset)
            md_rows.append({"system": f"{s['sid']} {s['formula']}", "natoms": len(s["relaxed"]), "forces": label, **r})
            print(f"[study] NVE {label} {s['formula']}: {r}", flush=True)
        ref_atoms, ref = relax(s["init"], EMT(), args.fmax, args.relax_steps)
        ref_e = ref["energy"] - off
        relax_rows.append({"system": f"{s['sid']} {s['formula']}", "forces": "EMT (reference)", "steps": ref["steps"],
                           "converged": ref["converged"], "E_final_eV": ref_e, "dE_vs_EMT_eV": 0.0,
                           "EMT_at_min_minus_EMT_min_eV": 0.0, "rmsd_free_A": 0.0})
        for label in ("gradient", "direct"):
            a, r = relax(s["init"], models[label], args.fmax, args.relax_steps)
            probe = a.copy()
            probe.calc = EMT()
            e_emt_at_min = float(probe.get_potential_energy()) - off
            relax_rows.append({"system": f"{s['sid']} {s['formula']}", "forces": f"EST {label}", "steps": r["steps"],
                               "converged": r["converged"], "E_final_eV": r["energy"], "dE_vs_EMT_eV": r["energy"] - ref_e,
                               "EMT_at_min_minus_EMT_min_eV": e_emt_at_min - ref_e, "rmsd_free_A": rmsd_free(a, ref_atoms)})
            print(f"[study] BFGS {label} {s['formula']}: {relax_rows[-1]}", flush=True)

    cont_rows = []
    for label in ("gradient", "direct"):
        r = cutoff_continuity(systems[0]["relaxed"], models[label], cutoff=5.0, n=60 if args.md_steps < 50 else 120)
        cont_rows.append({"forces": f"EST {label}", **r})
        print(f"[study] cutoff continuity {label}: {r}", flush=True)

    def summary(rows, key, labels):
        out = []
        for lab in labels:
            rs = [r for r in rows if r["forces"] == lab]
            out.append({"forces": lab, **{f"mean |{k}|": float(np.mean([abs(r[k]) for r in rs])) for k in key}})
        return out

    labels = ["EMT (reference)", "EST gradient", "EST direct"]
    print_table(train_rows, list(train_rows[0]), f"Training (same budget, {threads} threads)")
    print_table(md_rows, ["system", "natoms", "forces", "steps", "drift_meV_atom_ps", "max_dev_meV_atom", "T_end_K", "seconds", "failed"],
                f"NVE VelocityVerlet, 1 fs x {args.md_steps}, 300 K start, {'float64' if args.float64 else 'float32'}")
    md_sum = summary(md_rows, ["drift_meV_atom_ps", "max_dev_meV_atom"], labels)
    print_table(md_sum, list(md_sum[0]), "NVE summary (mean over systems)")
    print_table(relax_rows, ["system", "forces", "steps", "converged", "E_final_eV", "dE_vs_EMT_eV",
                             "EMT_at_min_minus_EMT_min_eV", "rmsd_free_A"], f"BFGS relaxation (fmax {args.fmax} eV/A)")
    rl_sum = summary(relax_rows, ["dE_vs_EMT_eV", "EMT_at_min_minus_EMT_min_eV", "rmsd_free_A", "steps"], labels)
    print_table(rl_sum, list(rl_sum[0]), "Relaxation summary (mean over systems)")
    print_table(cont_rows, list(cont_rows[0]), "Energy along a 1.5 A path of the adsorbate (cutoff 5 A)")
    path = save(args.name, {"args": vars(args), "data_seconds": t_data, "train": train_rows, "nve": md_rows,
                            "cutoff_continuity": cont_rows,
                            "nve_summary": md_sum, "relax": relax_rows, "relax_summary": rl_sum,
                            "total_seconds": time.time() - t_start})
    print(f"[study] wrote {path} in {time.time() - t_start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
