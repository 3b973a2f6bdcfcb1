"""Relaxing many molecules: torch-sim's batched FIRE vs one ASE FIRE run per structure, same est model.

``--structures`` (64) copies of a molecule of ``est.data.molecules`` (ethanol by
default), each rattled by ``--rattle`` A (Gaussian, seed = its index), relaxed
to the same criterion, max_i |F_i| < ``--fmax`` eV/A (force norm per atom), in
two ways with the same weights and precision:

* torch-sim: all structures in one ``SimState``, ``ts.optimize`` with
  ``ts.optimizers.fire`` (``md_flavor="ase_fire"``, ASE's defaults: dt 0.1,
  dt_max 1.0, max step 0.2 A) through :class:`est.calculators.torch_sim.ESTTorchSimModel`,
  converged structures leaving the batch (convergence checked every step,
  ``steps_between_swaps=1``, as ASE);
* ASE: one :class:`est.calculators.ESTCalculator` (built once) and
  ``ase.optimize.FIRE`` (same parameters), one structure after the other.

Printed side by side: wall clock (and the ratio ASE / torch-sim), structures
converged within ``--max-steps`` (torch-sim counts its steps for the whole
batch), FIRE steps, and the agreement of the final energies, max |dE| / atom
(and the largest final-position difference). The model is a trained checkpoint
(``--checkpoint``, e.g. a ``study_forces.py`` run on GFN2-xTB ethanol) or, without
one, ``--shape`` (``est-tiny``, gradient forces, polynomial envelope) with random
weights (seed 0, energy scale 1 eV): a random but smooth potential, which says
nothing about chemistry and everything about the two engines. One CPU thread by
default (``EST_BENCH_THREADS``).

    python benchmarks/bench_torch_sim.py [--checkpoint runs/forces/ethanol/est-ffn-s0] [--structures 64]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table, save, setup_threads  # noqa: E402

from est.calculators import ESTCalculator  # noqa: E402
from est.calculators.torch_sim import ESTTorchSimModel  # noqa: E402
from est.data.molecules import molecule  # noqa: E402
from est.models import build_model  # noqa: E402

#: ASE's FIRE defaults, which torch-sim's ``md_flavor="ase_fire"`` mirrors
FIRE = dict(dt=0.1, dt_max=1.0, max_step=0.2)


def structures(name: str, count: int, rattle: float) -> list:
    """``count`` copies of molecule ``name``, copy ``i`` rattled with seed ``i``."""
    out = []
    for i in range(count):
        atoms = molecule(name)
        atoms.rattle(stdev=rattle, seed=i)
        out.append(atoms)
    return out


def engines(checkpoint: str | None, shape: str, dtype: torch.dtype):
    """(ESTCalculator, ESTTorchSimModel, description) sharing the same weights."""
    if checkpoint:
        from est.train.checkpoint import load_checkpoint, resolve_checkpoint_path

        ck = load_checkpoint(resolve_checkpoint_path(checkpoint))
        m, d = ck["config"]["model"], ck["config"]["data"]
        what = (f"{m.get('name')} (update={m.get('update', 'preset')}, forces {m.get('regress_forces')}) trained "
                f"{ck.get('step')} steps on {d.get('train_path') or d.get('task')} ({checkpoint})")
        return ESTCalculator(checkpoint, dtype=dtype), ESTTorchSimModel(checkpoint, device="cpu", dtype=dtype), what
    torch.manual_seed(0)
    model = build_model(shape, regress_forces="gradient", envelope="polynomial", use_pbc=False,
                        avg_num_nodes=9.0, avg_degree=8.0).eval()
    kw = dict(energy_mean=0.0, energy_std=1.0)
    return (ESTCalculator(model=model, dtype=dtype, **kw), ESTTorchSimModel(model=model, device="cpu", dtype=dtype, **kw),
            f"{shape} (gradient forces) with random weights, seed 0, energy scale 1 eV")


def relax_torch_sim(atoms_list: list, model, *, fmax: float, max_steps: int) -> dict:
    import torch_sim as ts

    t0 = time.perf_counter()
    final = ts.optimize(system=atoms_list, model=model,
                        optimizer=ts.optimizers.fire,
                        convergence_fn=ts.generate_force_convergence_fn(force_tol=fmax, include_cell_forces=False),
                        max_steps=max_steps, steps_between_swaps=1, dt_start=FIRE["dt"], dt_max=FIRE["dt_max"],
                        max_step=FIRE["max_step"], md_flavor="ase_fire")
    wall = time.perf_counter() - t0
    force = torch.zeros(final.n_systems, dtype=final.forces.dtype).scatter_reduce(
        0, final.system_idx, final.forces.norm(dim=1), reduce="amax")  # [S]
    return {"wall_s": wall, "energy": final.energy.double().numpy(), "max_force": force.double().numpy(),
            "positions": [final.positions[final.system_idx == k].double().numpy() for k in range(final.n_systems)]}


def relax_ase(atoms_list: list, calc, *, fmax: float, max_steps: int) -> dict:
    from ase.optimize import FIRE as AseFIRE

    energy, force, pos, steps, converged = [], [], [], [], []
    t0 = time.perf_counter()
    for atoms in atoms_list:
        a = atoms.copy()
        a.calc = calc
        opt = AseFIRE(a, dt=FIRE["dt"], dtmax=FIRE["dt_max"], maxstep=FIRE["max_step"], logfile=None)
        converged.append(bool(opt.run(fmax=fmax, steps=max_steps)))
        steps.append(opt.nsteps)
        energy.append(a.get_potential_energy())
        force.append(float(np.linalg.norm(a.get_forces(), axis=1).max()))
        pos.append(a.positions.copy())
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "energy": np.array(energy), "max_force": np.array(force), "positions": pos,
            "steps": steps, "converged": converged}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", help="an est.train checkpoint or run folder (default: random weights)")
    ap.add_argument("--shape", default="est-tiny", help="registry shape of the random-weight model")
    ap.add_argument("--molecule", default="ethanol")
    ap.add_argument("--structures", type=int, default=64)
    ap.add_argument("--rattle", type=float, default=0.1, help="Gaussian displacement of every coordinate, A")
    ap.add_argument("--fmax", type=float, default=0.05, help="eV/A")
    ap.add_argument("--max-steps", type=int, default=300)
    ap.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    ap.add_argument("--save-as", default="torch_sim", help="benchmarks/results/<name>.json")
    args = ap.parse_args(argv)
    threads = setup_threads(int(__import__("os").environ.get("EST_BENCH_THREADS", 1)))
    dtype = getattr(torch, args.dtype)
    calc, ts_model, what = engines(args.checkpoint, args.shape, dtype)
    atoms_list = structures(args.molecule, args.structures, args.rattle)
    natoms = len(atoms_list[0])
    ts_res = relax_torch_sim(atoms_list, ts_model, fmax=args.fmax, max_steps=args.max_steps)
    ase_res = relax_ase(atoms_list, calc, fmax=args.fmax, max_steps=args.max_steps)
    de = np.abs(ts_res["energy"] - ase_res["energy"]) / natoms
    dx = max(float(np.abs(a - b).max()) for a, b in zip(ts_res["positions"], ase_res["positions"]))
    both = (ts_res["max_force"] < args.fmax) & (ase_res["max_force"] < args.fmax)
    rows = [
        {"engine": "torch-sim, one batch (ts.optimize, FIRE)", "wall (s)": ts_res["wall_s"],
         "time / ASE's": ts_res["wall_s"] / ase_res["wall_s"],
         "converged": f"{int((ts_res['max_force'] < args.fmax).sum())}/{args.structures}",
         "max final force (eV/A)": float(ts_res["max_force"].max())},
        {"engine": "ASE, one structure at a time (FIRE)", "wall (s)": ase_res["wall_s"], "time / ASE's": 1.0,
         "converged": f"{sum(ase_res['converged'])}/{args.structures}",
         "max final force (eV/A)": float(ase_res["max_force"].max()),
         "FIRE steps (mean)": float(np.mean(ase_res["steps"]))},
    ]
    title = (f"{args.structures} x {args.molecule} ({natoms} atoms, rattled {args.rattle} A), fmax {args.fmax} eV/A, "
             f"{args.dtype}, {threads} CPU thread(s); model: {what}")
    table = print_table(rows, ["engine", "wall (s)", "time / ASE's", "converged", "max final force (eV/A)",
                               "FIRE steps (mean)"], title)
    agree = (f"Final energies, torch-sim vs ASE: max |dE| / atom {de.max():.2e} eV (median {np.median(de):.2e}) over "
             f"all {args.structures} structures, {de[both].max() if both.any() else float('nan'):.2e} over the "
             f"{int(both.sum())} both converged; largest final position difference {dx:.2e} A. "
             f"Wall time torch-sim / ASE: {ts_res['wall_s'] / ase_res['wall_s']:.2f}.")
    print(agree)
    save(args.save_as, {"script": "bench_torch_sim.py", "argv": list(argv if argv is not None else sys.argv[1:]),
                        "model": what, "config": vars(args), "natoms": natoms, "rows": rows,
                        "max_abs_de_per_atom_eV": float(de.max()), "median_abs_de_per_atom_eV": float(np.median(de)),
                        "max_position_diff_A": dx, "speedup_torch_sim": ase_res["wall_s"] / ts_res["wall_s"],
                        "ase_steps": ase_res["steps"], "tables": [table, agree]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
