#!/usr/bin/env python
"""Equivariance error of models: one line per (model, sample), one column per check.

Generic driver: :func:`run` takes ``[(name, model, sample), ...]`` (any model
``est.testing.check_model`` accepts: est models, ``(positions, numbers, cell,
pbc) -> dict`` callables, adapters) and :func:`summary_table` prints the
largest relative error of each check (over outputs and degrees; ``*`` marks a
failure at the tolerance of the model's dtype, ``(i)`` an informational
reflection row). The study on trained models plugs its own entries into
``run``.

Usage::

    python benchmarks/bench_equivariance.py                 # toy and e3nn models, float64 and float32
    python benchmarks/bench_equivariance.py --config eqv2-tiny --config est-tiny   # + untrained backbones
    python benchmarks/bench_equivariance.py --no-defaults --config eqv2-tiny --modules   # where the error enters
    python benchmarks/bench_equivariance.py --full --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Sequence

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from est.testing import EquivarianceReport, check_model, check_modules  # noqa: E402

COLUMNS = ("rotation", "translation", "permutation", "lattice_shift", "supercell", "reflection", "repeat")


def run(entries: Sequence[tuple[str, Any, Any]], **check_kwargs: Any) -> list[tuple[str, EquivarianceReport, float]]:
    """``check_model`` on every ``(name, model, sample)``; returns ``(name, report, seconds)``."""
    out = []
    for name, model, sample in entries:
        t0 = time.perf_counter()
        report = check_model(model, sample, name=name, **check_kwargs)
        out.append((name, report, time.perf_counter() - t0))
    return out


def _column(check: str) -> str:
    if check == "cell_rotation":
        return "rotation"
    if check.startswith("supercell"):
        return "supercell"
    return check


def summary_table(results: Sequence[tuple[str, EquivarianceReport, float]]) -> str:
    """One line per entry: worst relative error per check column."""
    head = ("model", "dtype", "atoms") + COLUMNS + ("status", "time")
    lines = []
    for name, report, seconds in results:
        cells = {}
        for col in COLUMNS:
            rows = [r for r in report.rows if _column(r.check) == col]
            if not rows:
                cells[col] = "-"
                continue
            worst = max(r.max_rel for r in rows)
            mark = "*" if any(r.expected and not r.ok for r in rows) else ("(i)" if not rows[0].expected else "")
            cells[col] = f"{worst:.1e}{mark}"
        status = "ok" if report.ok else "FAIL"
        atoms = f"{report.meta['num_atoms']}{'p' if report.meta['periodic'] else ''}"
        lines.append((name, str(report.dtype).replace("torch.", ""), atoms) + tuple(cells[c] for c in COLUMNS) + (status, f"{seconds:.1f}s"))
    widths = [max(len(h), *(len(l[i]) for l in lines)) if lines else len(h) for i, h in enumerate(head)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    legend = "max relative error per check (over outputs and degrees); * fails the dtype tolerance; (i) informational; p periodic"
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(l) for l in lines] + [legend])


def module_table(report: EquivarianceReport) -> str:
    """Per-module profile (from :func:`est.testing.check_modules`): worst relative error and its degree."""
    out = [report.title, f"{'module':<60}  {'max rel':>8}  {'mean rel':>8}  worst l"]
    for module in report.meta["modules"]:
        rows = [r for r in report.rows if r.output == module]
        worst = max(rows, key=lambda r: r.max_rel)
        out.append(f"{module:<60}  {worst.max_rel:8.1e}  {max(r.mean_rel for r in rows):8.1e}  {worst.component}")
    return "\n".join(out)


def default_entries() -> list[tuple[str, Any, Any]]:
    """Toy and e3nn models on a molecule and a triclinic cell, correct and with planted defects."""
    from est.testing.toy_models import MorsePotential, e3nn_potential, example_crystal, example_molecule

    mol, crystal = example_molecule(8), example_crystal()
    entries = [
        ("morse", MorsePotential(cutoff=3.0).double(), mol),
        ("morse", MorsePotential(cutoff=3.0).double(), crystal),
        ("morse-f32", MorsePotential(cutoff=3.0), mol),
        ("morse-f32", MorsePotential(cutoff=3.0), crystal),
        ("e3nn-potential", e3nn_potential(cutoff=3.0), mol),
        ("e3nn-potential", e3nn_potential(cutoff=3.0), crystal),
    ]
    for defect in ("absolute_position", "symmetry_break", "permutation", "chiral"):
        entries.append((f"morse+{defect}", MorsePotential(cutoff=3.0, defect=defect).double(), mol))
    entries.append(("morse+no_images", MorsePotential(cutoff=3.0, defect="no_images").double(), crystal))
    return entries


def config_entries(names: Sequence[str], dtype: torch.dtype, overrides: dict) -> list[tuple[str, Any, Any]]:
    """Untrained est backbones by config name (``est.models.build_model``)."""
    from est.testing.check import load_model_for_check
    from est.testing.toy_models import example_crystal, example_molecule

    entries = []
    for name in names:
        model = load_model_for_check(config=name, overrides=overrides, dtype=dtype)
        entries += [(name, model, example_molecule(8)), (name, model, example_crystal())]
    return entries


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", action="append", default=[], help="also check est.models.build_model(name=CONFIG) (untrained)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="overrides for --config models")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float64", help="dtype of --config models")
    p.add_argument("--no-defaults", action="store_true", help="skip the toy and e3nn models")
    p.add_argument("--rotations", type=int, default=8)
    p.add_argument("--refine", type=int, default=12)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (small inputs: 1 is fastest)")
    p.add_argument("--full", action="store_true", help="print every report in full")
    p.add_argument("--modules", action="store_true", help="per-module profile of the --config models (forward hooks)")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from est.testing.check import _parse_overrides

    entries = [] if args.no_defaults else default_entries()
    entries += config_entries(args.config, getattr(torch, args.dtype), _parse_overrides(args.set))
    results = run(entries, num_rotations=args.rotations, refine_steps=args.refine)
    if args.full:
        for _, report, _ in results:
            print(report.table(), end="\n\n")
    print(summary_table(results))
    if args.modules:
        for name, model, sample in entries:
            if name in args.config:
                print()
                print(module_table(check_modules(model, sample, name=name)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dict(json.loads(r.to_json()), name=n, seconds=s) for n, r, s in results], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
