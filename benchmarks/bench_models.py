"""Backbones side by side: parameter counts and training-step time.

Parameter counts of every named shape (EquiformerV2's published sizes: 83M
S2EF-2M, 31M All+MD, 153M All+MD), and for the CPU shapes the time of one
training step (energy + gradient-free direct forces, forward + backward) on a
batch of EMT-like Cu slabs, est's EquiformerV2 (``update="ffn"``) as the
baseline in the same run.

    python benchmarks/bench_models.py [--quick] [--device cpu]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch_geometric.data import Batch, Data

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median_time, print_table, save, setup_threads  # noqa: E402

from est.models import MODEL_CONFIGS, EquiformerV2, model_config  # noqa: E402

PUBLISHED = {"equiformer_v2-s2ef-2m": 83e6, "equiformer_v2-31m": 31e6, "equiformer_v2-153m": 153e6}


def slab_batch(num: int, device: str) -> Batch:
    from ase.build import add_adsorbate, fcc111

    datas = []
    for i in range(num):
        atoms = fcc111("Cu", size=(3, 3, 3), vacuum=6.0)
        add_adsorbate(atoms, "O", 1.6, "fcc")
        g = torch.Generator().manual_seed(i)
        pos = torch.tensor(atoms.positions, dtype=torch.float32) + 0.05 * torch.randn(len(atoms), 3, generator=g)
        datas.append(Data(pos=pos, atomic_numbers=torch.tensor(atoms.numbers), natoms=torch.tensor([len(atoms)]),
                          cell=torch.tensor(atoms.cell.array, dtype=torch.float32)[None],
                          pbc=torch.tensor([[True, True, True]])))
    return Batch.from_data_list(datas).to(device)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    threads = setup_threads()
    counts = []
    for name in MODEL_CONFIGS:
        n = EquiformerV2(model_config(name)).num_parameters()
        row = dict(model=name, parameters_M=n / 1e6)
        if name in PUBLISHED:
            row["published_M"] = PUBLISHED[name] / 1e6
            row["ratio"] = n / PUBLISHED[name]
        counts.append(row)
    print_table(counts, ["model", "parameters_M", "published_M", "ratio"], "Parameter counts")
    batch = slab_batch(2 if args.quick else 4, args.device)
    rows = []
    names = ["eqv2-tiny", "est-tiny", "est-paper-tiny", "spherical-tiny"] + ([] if args.quick else ["eqv2-small", "est-small"])
    for name in names:
        model = EquiformerV2(model_config(name, cutoff=6.0, max_neighbors=20)).to(args.device).train()

        def step():
            out = model(batch)
            (out["energy"].sum() + out["forces"].pow(2).sum()).backward()

        t = median_time(step, repeats=3 if args.quick else 5)
        rows.append(dict(model=name, parameters_M=model.num_parameters() / 1e6, step_ms=1e3 * t))
    for base in ("eqv2-tiny", "eqv2-small"):
        ref = next((r for r in rows if r["model"] == base), None)
        for r in rows:
            if ref and r["model"].endswith(base.split("-")[1]):
                r["vs_eqv2"] = r["step_ms"] / ref["step_ms"]
    print_table(rows, ["model", "parameters_M", "step_ms", "vs_eqv2"],
                f"Training step (energy + direct forces), {len(batch)} Cu slabs of {batch.natoms[0].item()} atoms, "
                f"{args.device}, {threads} threads, median")
    save("models", dict(parameters=counts, steps=rows))


if __name__ == "__main__":
    main()
