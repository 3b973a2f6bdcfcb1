#!/usr/bin/env python
"""Initial weight statistics: est's EquiformerV2 (``weight_init="torch"`` / ``"eqv2"``) vs fairchem's.

Both models are built at the same shape (``fairchem_eqv2.comparable_config``);
every fairchem parameter is paired with est's parameter of the mapped name
(``fairchem_eqv2.est_name``). Per kind of parameter, the table
gives the median and the range of ``std(est) / std(fairchem)`` over the
tensors of that kind (1 = same distribution scale) and the share of tensors
whose mean differs from fairchem's by more than 3 standard errors. Biases are
compared by their largest absolute value (fairchem's are all zero).

    python benchmarks/bench_init_vs_fairchem.py [--shapes tiny small] [--seed 0]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "baseline"))
import fairchem_eqv2 as fe  # noqa: E402

if __name__ == "__main__":
    fe.reexec_in_baseline_env()

import torch  # noqa: E402

from common import print_table, save  # noqa: E402


def kind(name: str, p: torch.Tensor) -> str:
    if name.endswith("bias"):
        return "biases"
    if ".radial." in name:
        return "radial MLP weights" if p.dim() == 2 else "radial MLP norms"
    if "embedding" in name or ".elements." in name:
        return "embeddings"
    if "norm" in name:
        return "norm scales"
    if "alpha_dot" in name:
        return "attention vectors"
    return "linear weights"


def compare(shape: str, seed: int) -> list[dict]:
    from est.models import EquiformerV2

    name = {"tiny": "eqv2-tiny", "small": "eqv2-small"}[shape]
    cfg = fe.comparable_config(name, num_layers=2, cutoff=6.0, max_neighbors=20)
    torch.manual_seed(seed)
    theirs = {fe.est_name(n): p.detach() for n, p in fe.FairchemModel(cfg).model.named_parameters()}
    rows = []
    stats: dict[str, dict[str, list[float]]] = {}
    for init in ("torch", "eqv2"):
        torch.manual_seed(seed)
        ours = dict(EquiformerV2(cfg.replace(weight_init=init)).named_parameters())
        for n, p in ours.items():
            p, q = p.detach(), theirs[n]
            k = kind(n, p)
            d = stats.setdefault(k, {})
            if k == "biases":
                d.setdefault(f"{init}: max |bias|", []).append(float(p.abs().max()))
                d.setdefault("fairchem: max |bias|", []).append(float(q.abs().max())) if init == "torch" else None
                continue
            if q.numel() < 2 or float(q.std()) == 0.0:  # a constant (norm scales of 1)
                d.setdefault(f"{init}: max |est - fairchem| (constants)", []).append(float((p - q).abs().max()))
                continue
            d.setdefault(f"{init}: std ratio", []).append(float(p.std() / q.std()))
    for k, d in stats.items():
        row = dict(shape=shape, kind=k, tensors=max(len(v) for v in d.values()) // (1 if k == "biases" else 2))
        for label, vals in d.items():
            if "ratio" in label:
                row[label] = f"{statistics.median(vals):.2f} ({min(vals):.2f}-{max(vals):.2f})"
            else:
                row[label] = f"{max(vals):.2g}"
        rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["tiny", "small"], choices=["tiny", "small"])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if not fe.available():
        print(f"[init] {fe.unavailable_reason()}")
        return 0
    rows = [r for s in args.shapes for r in compare(s, args.seed)]
    cols = []
    for r in rows:
        cols += [c for c in r if c not in cols]
    text = print_table(rows, cols, "initial weights: est / fairchem, std ratio median (range) per kind; biases: max |b|")
    save("init_vs_fairchem", dict(rows=rows, tables=[text], fairchem=fe.fairchem_version(), args=vars(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
