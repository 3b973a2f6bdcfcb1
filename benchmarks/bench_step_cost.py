#!/usr/bin/env python
r"""How firm the force study's equal-time clock is: the EST default's step cost over EquiformerV2's, re-timed.

The equal-time reads of ``study_forces.py`` (issue 17's target) put every run on one clock: steps x the
model's step cost :math:`c`, the median CPU seconds of one optimisation step on one thread, both est models
timed round-robin on the same batches (``forces_clock.calibrate``), stored once per molecule
(``step_costs``). Only the ratio :math:`r = c_\mathrm{default}/c_\mathrm{ffn}` enters the target:

* the curve read: the EST default's validation force MAE at EquiformerV2's end :math:`T = n\,c_\mathrm{ffn}`
  is read at its step :math:`n/r`;
* an ``est-default@time`` run was given :math:`\mathrm{round}(n/r_0)` steps, :math:`r_0` the ratio stored
  when it started, so at a ratio :math:`r` it had :math:`r/r_0` of EquiformerV2's time.

This script times :math:`r` again, ``--repeats`` times per molecule (each a fresh calibration: new trainers,
the same protocol), and prints beside the stored :math:`r` the fresh ones, the share of EquiformerV2's time
the ``@time`` runs had at the fresh mean, and the target's curve read (mean over paired seeds) at the stored
and at the fresh ratio. Nothing is trained; one thread. Timing some molecules keeps the other molecules'
timings in ``step_cost.json``; every row's readings are taken afresh from the current ``forces.json``, and
``--tables-only`` does only that (no timing: after new runs have landed in the study).

    python benchmarks/bench_step_cost.py [--data-dir /work/data/xtb] [--repeats 3] [--molecules ethanol ...]
    python benchmarks/bench_step_cost.py --tables-only
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "baseline"))

from common import dash_missing, load, print_table, save, setup_threads  # noqa: E402
from forces_clock import calibrate, with_step_cost_clock  # noqa: E402
from forces_setup import FULL, REFERENCE, TARGET, TIME_SUFFIX  # noqa: E402
from forces_tables import equal_time, time_share  # noqa: E402

MODEL = TARGET[0]


def ratio(costs: dict[str, dict]) -> float:
    """:math:`r = c_\\mathrm{default}/c_\\mathrm{ffn}` of one ``{model: {"cpu_s"}}`` record."""
    return costs[MODEL]["cpu_s"] / costs[REFERENCE]["cpu_s"]


def on_clock(runs: dict[str, list[dict]], r: float) -> dict[str, list[dict]]:
    """A copy of the EST default's, its ``@time`` runs' and EquiformerV2's records on the step-cost clock with
    the cost ratio ``r`` (``forces_clock.with_step_cost_clock``; EquiformerV2's step costs 1)."""
    per_model = copy.deepcopy({m: runs[m] for m in (MODEL, MODEL + TIME_SUFFIX, REFERENCE) if m in runs})
    with_step_cost_clock({"m": per_model}, {"m": {REFERENCE: {"cpu_s": 1.0}, MODEL: {"cpu_s": r}}})
    return per_model


def target_read(clocked: dict[str, list[dict]]) -> float:
    """The target's equal-time read of records on the step-cost clock (:func:`on_clock`): the mean over paired
    seeds of the EST default's validation force MAE over EquiformerV2's (``forces_tables.equal_time``)."""
    read = [p["ratio"] for p in equal_time(clocked[MODEL], clocked[REFERENCE], clock="step-cost")]
    read = [x for x in read if not math.isnan(x)]
    return statistics.fmean(read) if read else math.nan


def budgeted_ratio(timed: list[dict]) -> float:
    """:math:`r_0`, the ratio the ``@time`` runs were budgeted with (their ``time_budget``; nan if they differ)."""
    r0 = {round(rec["time_budget"]["step_cost_s"] / rec["time_budget"]["reference_step_cost_s"], 6) for rec in timed}
    return r0.pop() if len(r0) == 1 else math.nan


TIMED = ("fresh r (each)", "fresh r (mean)", "fresh r (sd)", "load avg")  # what a molecule's calibrations measured


def timed_columns(fresh: list[dict[str, dict]], load: str) -> dict:
    """The :data:`TIMED` columns of a molecule's repeated calibrations ``fresh`` (``forces_clock.calibrate``)."""
    rs = [ratio(f) for f in fresh]
    return {"fresh r (each)": " ".join(f"{x:.3f}" for x in rs), "fresh r (mean)": statistics.fmean(rs),
            "fresh r (sd)": statistics.stdev(rs) if len(rs) > 1 else math.nan, "load avg": load}


def row(molecule: str, runs: dict[str, list[dict]], stored: dict[str, dict], timed: dict) -> dict:
    """One molecule's table row (floats): the stored ratio, the calibrations ``timed`` (:func:`timed_columns`)
    and what the study's records ``runs`` read at the stored and at the fresh mean ratio."""
    at_stored, at_fresh = on_clock(runs, ratio(stored)), on_clock(runs, timed["fresh r (mean)"])
    time_runs = at_fresh.get(MODEL + TIME_SUFFIX, [])
    both = MODEL in runs and REFERENCE in runs
    return {"molecule": molecule, "stored r": ratio(stored),
            "@time runs' r0": budgeted_ratio(time_runs) if time_runs else math.nan,
            "fresh r (each)": timed["fresh r (each)"], "fresh r (mean)": timed["fresh r (mean)"],
            "fresh r (sd)": timed["fresh r (sd)"],
            "@time runs' time / EquiformerV2's": (time_share(time_runs, at_fresh[REFERENCE])
                                                  if time_runs and REFERENCE in runs else math.nan),
            "target read, stored r": target_read(at_stored) if both else math.nan,
            "target read, fresh r": target_read(at_fresh) if both else math.nan, "load avg": timed["load avg"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", default="/work/data/xtb")
    p.add_argument("--molecules", nargs="*", help="default: every molecule with stored step costs and data here")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=7, help="timed rounds per calibration (the study's: 7)")
    p.add_argument("--tables-only", action="store_true",
                   help="time nothing: re-read the rows of step_cost.json against the current forces.json")
    args = p.parse_args(argv)
    threads = setup_threads(1)
    forces = load("forces")
    if not forces:
        raise SystemExit("[step-cost] no benchmarks/results/forces.json: run study_forces.py first")
    data_dir = Path(args.data_dir)
    stored = forces.get("step_costs", {})
    previous = load("step_cost") or {}
    timed = {r["molecule"]: {k: r[k] for k in TIMED} for r in previous.get("rows", [])}
    if args.tables_only:
        if not timed:
            raise SystemExit("[step-cost] --tables-only: no benchmarks/results/step_cost.json rows to re-read")
    else:
        molecules = args.molecules or [m for m in stored if (data_dir / m / "train").is_dir()]
        for molecule in molecules:  # all checked before any is timed
            if not {MODEL, REFERENCE} <= set(stored.get(molecule, {})):
                raise SystemExit(f"[step-cost] {molecule}: forces.json has no step costs of {MODEL} and {REFERENCE}")
        for molecule in molecules:
            load0 = os.getloadavg()[0]
            fresh = [calibrate(molecule, [REFERENCE, MODEL], data_dir, FULL, rounds=args.rounds)
                     for _ in range(args.repeats)]
            timed[molecule] = timed_columns(fresh, f"{load0:.1f}-{os.getloadavg()[0]:.1f}")
            print(f"[step-cost] {molecule}: r = {timed[molecule]['fresh r (each)']} "
                  f"(stored {ratio(stored[molecule]):.3f})", flush=True)
    rows = [row(m, forces["runs"].get(m, {}), stored[m], timed[m]) for m in stored if m in timed]
    shown = [{k: (f"{v:.3f}" if k.endswith(("r", "r0", "(mean)", "(sd)")) and isinstance(v, float) else
                  f"{v:.2f}" if isinstance(v, float) else v) for k, v in r.items()} for r in rows]
    repeats, rounds = (previous["repeats"], previous["rounds"]) if args.tables_only else (args.repeats, args.rounds)
    table = print_table(dash_missing(shown), list(shown[0]),
                        f"r = {MODEL} / {REFERENCE} step cost, {repeats} fresh calibrations of {rounds} "
                        f"rounds each, {threads} thread")
    save("step_cost", {"description": __doc__.split("\n")[0], "repeats": repeats, "rounds": rounds,
                       "rows": rows, "tables": {"step-cost": table.split("\n", 2)[2]}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
