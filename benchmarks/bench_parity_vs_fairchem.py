#!/usr/bin/env python
"""Is est's EquiformerV2 (``update="ffn"``) the same function as fairchem's? Same weights, same inputs.

fairchem-core 1.10.0's EquiformerV2 is built at a shape
(``fairchem_eqv2.comparable_config``), its weights are copied into est's
model of the same config by parameter name (:func:`fairchem_eqv2.fairchem_to_est`: a
fixed renaming, no reshaping), and both predict energy and forces for the
same structures in float64 (eval mode; both built under a float64 default
dtype, since fairchem builds its Wigner-D tables in the default dtype). Reported: relative differences
``max |est - fairchem| / max |fairchem|``, next to fairchem's own
run-to-run spread (it draws a random roll of every edge frame per call, so
two identical fairchem calls differ by its equivariance error: the floor
below which the two libraries cannot be compared). Also the gradient of a
training loss (``E^2 + sum |F|^2``) with respect to every parameter,
relative difference of the norms per parameter (worst and median): what the
optimiser sees at identical weights.

    python benchmarks/bench_parity_vs_fairchem.py [--shapes tiny small] [--layers 2]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "baseline"))
import fairchem_eqv2 as fe  # noqa: E402

if __name__ == "__main__":
    fe.reexec_in_baseline_env()

import torch  # noqa: E402

from common import print_table, save, setup_threads  # noqa: E402

def structures():
    from ase.build import molecule

    from bench_vs_fairchem import oc20_slabs

    return {"ethanol": molecule("CH3CH2OH"), "Cu(111)+CO slab": oc20_slabs(1, (3, 3, 3))[0]}


def loss_gradients(net, fn, inputs, *, rename=lambda name: name) -> dict[str, torch.Tensor]:
    """``{est parameter name: d loss / d parameter}`` of ``loss = E^2 + sum |F|^2`` for one structure."""
    net.zero_grad(set_to_none=True)
    out = fn(*inputs)
    (out["energy"].pow(2).sum() + out["forces"].pow(2).sum()).backward()
    return {rename(n): p.grad.detach().clone() for n, p in net.named_parameters() if p.grad is not None}


def compare(shape: str, layers: int, calls: int, seed: int) -> list[dict]:
    from est.models import EquiformerV2
    from est.testing import default_dtype

    name = {"tiny": "eqv2-tiny", "small": "eqv2-small", "31m": "equiformer_v2-31m"}[shape]
    cfg = fe.comparable_config(name, num_layers=layers, cutoff=6.0, max_neighbors=20)
    torch.manual_seed(seed)
    with default_dtype(torch.float64):  # fairchem builds constants (its Wigner-D tables) in the default dtype
        theirs = fe.FairchemModel(cfg).double().eval()
    ours = EquiformerV2(cfg).double().eval()
    fe.fairchem_to_est(theirs.model, ours)
    f_fc, f_est = fe.fairchem_callable(theirs), fe.fairchem_callable(ours)
    rows = []
    for sname, atoms in structures().items():
        if hasattr(atoms, "get_positions"):  # ase.Atoms
            pos = torch.tensor(atoms.get_positions(), dtype=torch.float64)
            z, pbc = torch.tensor(atoms.get_atomic_numbers()), torch.tensor(atoms.pbc)
            cell = torch.tensor(atoms.get_cell().array, dtype=torch.float64) if atoms.pbc.any() else None
        else:  # a torch_geometric Data in est's sample layout
            pos, z = atoms.pos.double(), atoms.atomic_numbers.long()
            cell, pbc = atoms.cell.reshape(3, 3).double(), atoms.pbc.reshape(3).bool()
        with torch.no_grad():
            ref = [f_fc(pos, z, cell, pbc) for _ in range(calls)]
            mine = f_est(pos, z, cell, pbc)
        row = dict(shape=shape, layers=layers, structure=sname, atoms=int(pos.shape[0]))
        for key in ("energy", "forces"):
            scale = float(ref[0][key].abs().max())
            row[f"{key} est vs fairchem"] = float((mine[key] - ref[0][key]).abs().max()) / scale
            row[f"{key} fairchem vs itself"] = max(float((r[key] - ref[0][key]).abs().max()) for r in ref[1:]) / scale
        # what training sees: the gradient of a loss on energy and forces, parameter by parameter
        g_fc = loss_gradients(theirs.model, f_fc, (pos, z, cell, pbc), rename=fe.est_name)
        g_est = loss_gradients(ours, f_est, (pos, z, cell, pbc))
        if set(g_fc) != set(g_est):
            raise KeyError(f"parameters with a gradient differ: {sorted(set(g_fc) ^ set(g_est))[:5]}")
        rel = sorted(float((g_est[n] - g_fc[n]).norm() / g_fc[n].norm()) for n in g_fc if g_fc[n].norm() > 0)
        row["loss gradient est vs fairchem (worst parameter)"] = rel[-1]
        row["(median parameter)"] = rel[len(rel) // 2]
        rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["tiny", "small"], choices=["tiny", "small", "31m"])
    ap.add_argument("--layers", type=int, default=2, help="num_layers (the rest of the shape as named)")
    ap.add_argument("--calls", type=int, default=4, help="fairchem calls (its run-to-run spread)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if not fe.available():
        print(f"[parity] {fe.unavailable_reason()}")
        return 0
    threads = setup_threads()
    rows = [r for s in args.shapes for r in compare(s, args.layers, args.calls, args.seed)]
    cols = list(rows[0])
    text = print_table(rows, cols, f"est update='ffn' with fairchem's weights vs fairchem (float64, eval, relative max "
                                   f"difference; {threads} threads)")
    save("parity_vs_fairchem", dict(rows=rows, tables=[text], fairchem=fe.fairchem_version(), args=vars(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
