#!/usr/bin/env python
"""CPU training step and MD call with glibc's default allocation and with ``trainer.keep_freed_memory``
(est.train.malloc), est's models and MACE.

Per molecule of the GFN2-xTB set (``python -m est.data.xtb``) and per setting,
one fresh process on one thread times an optimisation step of est's
EquiformerV2 (``update="ffn"``) and the EST default round-robin, the force
study's models, batch and trainer settings (``forces_clock.calibrate``:
median CPU seconds of 7 rounds after 2 warm-up on the same batches); before
that, one ``ESTCalculator`` energy-and-forces call on the molecule in
float64 (the study's MD; random weights, median of 30); and it records the
process's peak resident memory (the setting's cost). After them, where the
MACE venv is installed, MACE's step under the same setting
(``forces_clock.mace_step_cost``: a short ``run_train`` of the study's
config, its allocator set through the environment). The settings alternate
twice (default, kept, default, kept), so a change of the machine's load
shows up as a spread between the two processes of one setting; the table
gives their mean and the ratio of the means. Linux with glibc only
(elsewhere the setting changes nothing).

    python benchmarks/bench_cpu_malloc.py --data-dir /work/data/xtb [--molecules ethanol paracetamol] [--root runs/forces]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "baseline"))

import mace_baseline as mb  # noqa: E402  (standard library only at import)
from common import print_table, save  # noqa: E402

MODELS = ("est-ffn", "est-default")
SETTINGS = ("glibc default", "keep_freed_memory")


def one(setting: str, molecule: str, data_dir: Path, root: Path) -> dict:
    """Step costs of :data:`MODELS` in this process under ``setting``, its peak resident memory (MiB), and
    MACE's step cost under ``setting`` (its exported frames cached under ``root``) where its venv is."""
    if setting == SETTINGS[1]:
        from est.train.malloc import keep_freed_memory

        if not keep_freed_memory():
            raise SystemExit("[malloc] the C library is not glibc: nothing to compare")
    from forces_clock import calibrate, mace_step_cost
    from forces_setup import FULL, MACE

    md = md_call_ms(molecule, data_dir)  # first, before training grows the heap
    costs = calibrate(molecule, list(MODELS), data_dir, FULL, keep_freed=False)  # the setting above
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    if mb.available():
        costs[MACE] = mace_step_cost(molecule, data_dir, root, FULL, keep_freed=setting == SETTINGS[1])
    return {"costs": costs, "md_call_ms": md, "max_rss_MiB": rss}


#: the columns only est's models have: the calculator call and this process's memory (MACE runs in its own)
EST_COLUMNS = ("MD call ms (default / kept)", "MD kept / default", "peak RSS MiB (default / kept)")


def est_columns(md: dict[str, dict[str, float]], rss: dict[str, float], model: str) -> dict[str, str]:
    """The :data:`EST_COLUMNS` of ``model``: mean MD call ms per setting (``md[setting][model]``), their
    ratio, and the peak resident memory per setting."""
    default, kept = SETTINGS
    return dict(zip(EST_COLUMNS, (f"{md[default][model]:.1f} / {md[kept][model]:.1f}",
                                  f"{md[kept][model] / md[default][model]:.2f}",
                                  f"{rss[default]:.0f} / {rss[kept]:.0f}")))


def md_call_ms(molecule: str, data_dir: Path, *, calls: int = 30, warmup: int = 3) -> dict[str, float]:
    """Median CPU milliseconds of one ``ESTCalculator`` energy-and-forces call (float64, the study's MD
    precision) per model, random weights, on the GFN2-xTB minimum moved by 1e-3 A noise before every call
    (so that no result is reused), the models round-robin."""
    import numpy as np
    import torch

    from est.calculators import ESTCalculator
    from forces_setup import random_model, relaxed_atoms

    torch.set_num_threads(1)
    torch.manual_seed(0)
    start = relaxed_atoms(data_dir, molecule)
    systems = {}
    for m in MODELS:
        atoms = start.copy()
        atoms.calc = ESTCalculator(model=random_model(m), dtype=torch.float64)
        systems[m] = atoms
    rng = np.random.default_rng(0)
    times: dict[str, list[float]] = {m: [] for m in MODELS}
    for i in range(warmup + calls):
        noise = 1e-3 * rng.standard_normal(start.positions.shape)
        for m, atoms in systems.items():
            atoms.positions = start.positions + noise
            c0 = time.process_time()
            atoms.get_forces()
            if i >= warmup:
                times[m].append(1000.0 * (time.process_time() - c0))
    return {m: statistics.median(v) for m, v in times.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", default=os.environ.get("EST_XTB_DIR", "runs/data/xtb"))
    p.add_argument("--molecules", nargs="+", default=["ethanol", "paracetamol"])
    p.add_argument("--repeats", type=int, default=2, help="processes per setting, alternating")
    p.add_argument("--root", default="runs/forces", help="where the force study caches MACE's exported frames")
    p.add_argument("--one", nargs=2, metavar=("SETTING", "MOLECULE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    data_dir = Path(args.data_dir)
    if args.one:
        print(json.dumps(one(args.one[0], args.one[1], data_dir, Path(args.root))))
        return 0
    env = {k: v for k, v in os.environ.items() if k not in mb.KEEP_FREED_ENV}  # each process starts at glibc's default
    runs: dict[str, dict[str, list[dict]]] = {}
    for molecule in args.molecules:
        runs[molecule] = {s: [] for s in SETTINGS}
        for _ in range(args.repeats):
            for setting in SETTINGS:
                out = subprocess.run([sys.executable, __file__, "--one", setting, molecule, "--data-dir", str(data_dir),
                                      "--root", args.root],
                                     check=True, capture_output=True, text=True, env=env).stdout
                runs[molecule][setting].append(json.loads(out.strip().splitlines()[-1]))
    rows = []
    for molecule, per in runs.items():
        models = [m for m in per[SETTINGS[0]][0]["costs"] if all(m in r["costs"] for s in SETTINGS for r in per[s])]
        ms = {s: {m: statistics.fmean(1000.0 * r["costs"][m]["cpu_s"] for r in per[s]) for m in models} for s in SETTINGS}
        rss = {s: max(r["max_rss_MiB"] for r in per[s]) for s in SETTINGS}
        md = {s: {m: statistics.fmean(r["md_call_ms"][m] for r in per[s]) for m in MODELS} for s in SETTINGS}
        for m in models:
            spread = {s: [f"{1000.0 * r['costs'][m]['cpu_s']:.0f}" for r in per[s]] for s in SETTINGS}
            rows.append({"molecule": molecule, "model": m,
                         "ms/step, glibc default": f"{ms[SETTINGS[0]][m]:.0f} ({' / '.join(spread[SETTINGS[0]])})",
                         "ms/step, keep_freed_memory": f"{ms[SETTINGS[1]][m]:.0f} ({' / '.join(spread[SETTINGS[1]])})",
                         "kept / default": f"{ms[SETTINGS[1]][m] / ms[SETTINGS[0]][m]:.2f}",
                         "step / EquiformerV2's, default": f"{ms[SETTINGS[0]][m] / ms[SETTINGS[0]][MODELS[0]]:.3f}",
                         "step / EquiformerV2's, kept": f"{ms[SETTINGS[1]][m] / ms[SETTINGS[1]][MODELS[0]]:.3f}",
                         **(est_columns(md, rss, m) if m in MODELS else dict.fromkeys(EST_COLUMNS, "-"))})
    cols = list(rows[0])
    table = print_table(rows, cols, "CPU training step and MD call: glibc's default allocation vs keep_freed_memory "
                                    "(one thread, the force study's batch of 16; per-process values in brackets)")
    save("cpu_malloc", {"description": __doc__.split("\n")[0], "data_dir": str(data_dir), "repeats": args.repeats,
                        "runs": runs, "tables": {"cpu-malloc": table.split("\n", 2)[2]}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
