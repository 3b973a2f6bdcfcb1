#!/usr/bin/env python
r"""The force study's 18 x 18 pair at higher degree and width: the EST default's training step over EquiformerV2's.

The force study trains the ``eqv2-tiny`` shape (L = 3, C = 32). On EquiformerV2's published 18 x 18 grid the
EST default's whole training step costs 0.86x EquiformerV2's there (``est-default-g18`` / ``est-ffn-g18``),
and its force error is level (0.99x at equal time, ethanol, 3 seeds). The update block alone costs 0.41x /
0.68x EquiformerV2's FFN block at L = 4 / 6 (``bench_est_block.py``, C = 128), so the step ratio
:math:`r_L = c_\mathrm{default}/c_\mathrm{ffn}` should move with L; this script measures it where it
decides the equal-time reading: the whole gradient-force training step of the study's two models with
``model.lmax=L`` (mmax 2, the EST design of degree :math:`t(L)` from ``est.nn.est_block.default_degree``)
at the study's width (C = 32: channels, attention and edge channels 32, FFN hidden 64) and at EquiformerV2's
(C = 128: all of them 128, FFN hidden 128), timed round-robin on the same batches on one thread (``forces_clock.calibrate``, the study's clock,
freed memory kept). Nothing is trained.

What it says about accuracy: nothing. At L = 3 the study measured both; at L > 3 an equal-time reading
needs the training runs: at L = 6 ``python benchmarks/study_forces.py --molecules ethanol --models
est-ffn-g18-l6 est-default-g18-l6`` (``forces_setup.L6_SUFFIX``).

    python benchmarks/bench_step_cost_lmax.py [--data-dir /work/data/xtb] [--molecule ethanol] \
        [--lmax 3 4 6] [--channels 32 128] [--repeats 2] [--rounds 5]

Results: ``benchmarks/results/step_cost_lmax.json``, block ``step-cost-lmax`` of docs/results.md. Rows of other
(L, C) already stored there for the same molecule are kept (timing one pair again replaces its row), so a noisy
row can be re-timed alone, e.g. ``--lmax 3 --channels 128 --repeats 3 --rounds 7``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "baseline"))

from common import print_table, save, setup_threads, with_stored_rows  # noqa: E402
from forces_clock import calibrate  # noqa: E402
from forces_setup import FULL, GRID18_SUFFIX, REFERENCE, TARGET  # noqa: E402

#: the pair: EquiformerV2 and the EST default, both on the 18 x 18 grid
PAIR = (REFERENCE + GRID18_SUFFIX, TARGET[0] + GRID18_SUFFIX)
#: channels -> FFN hidden channels: the study's eqv2-tiny width and EquiformerV2's
FFN_HIDDEN = {32: 64, 128: 128}


def shape(lmax: int, channels: int) -> tuple[str, ...]:
    """Overrides of the study's shape at degree ``lmax`` and width ``channels`` (a key of :data:`FFN_HIDDEN`)."""
    return (f"model.lmax={lmax}", f"model.channels={channels}", f"model.attn_hidden_channels={channels}",
            f"model.edge_channels={channels}", f"model.ffn_hidden_channels={FFN_HIDDEN[channels]}")


def lmax_row(lmax: int, channels: int, fresh: list[dict[str, dict]], load_avg: str) -> dict:
    """One table row from ``fresh`` calibrations (``calibrate``'s records) of the pair at ``lmax``, ``channels``."""
    from est.nn.est_block import default_degree
    from est.sphere.points import design_points

    ffn, est = PAIR
    ratios = [c[est]["cpu_s"] / c[ffn]["cpu_s"] for c in fresh]
    t = default_degree(lmax)
    return {"L": lmax, "C": channels, "EST design": f"t = {t}, S = {design_points(t)[0].shape[0]}",
            "EquiformerV2 step (s)": statistics.median(c[ffn]["cpu_s"] for c in fresh),
            "EST default step (s)": statistics.median(c[est]["cpu_s"] for c in fresh),
            "calibrations x rounds": f"{len(fresh)} x {fresh[0][ffn]['rounds']}",
            "r (each)": " ".join(f"{r:.3f}" for r in ratios), "r (mean)": statistics.fmean(ratios),
            "load avg": load_avg}


def merged_rows(rows: list[dict], molecule: str) -> list[dict]:
    """The stored rows of ``step_cost_lmax.json`` of ``molecule`` whose (L, C) is not in ``rows``, and ``rows``,
    ordered by C then L."""
    kept = with_stored_rows("step_cost_lmax", rows, lambda r: (r["L"], r["C"]), same={"molecule": molecule})
    return sorted(kept, key=lambda r: (r["C"], r["L"]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", default="/work/data/xtb")
    p.add_argument("--molecule", default="ethanol")
    p.add_argument("--lmax", type=int, nargs="+", default=[3, 4, 6])
    p.add_argument("--channels", type=int, nargs="+", default=[32, 128], choices=sorted(FFN_HIDDEN))
    p.add_argument("--repeats", type=int, default=2, help="fresh calibrations per L")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per calibration (the study's: 7)")
    args = p.parse_args(argv)
    data = Path(args.data_dir) / args.molecule
    if not (data / "train").is_dir():
        raise SystemExit(f"[step-cost-lmax] no training set at {data / 'train'}: python -m est.data.xtb "
                         f"--out {args.data_dir} --molecules {args.molecule}")
    threads = setup_threads(1)
    rows = []
    for channels in args.channels:
        for lmax in args.lmax:
            load0 = os.getloadavg()[0]
            fresh = [calibrate(args.molecule, list(PAIR), Path(args.data_dir), FULL, rounds=args.rounds,
                               extra=shape(lmax, channels)) for _ in range(args.repeats)]
            rows.append(lmax_row(lmax, channels, fresh, f"{load0:.1f}-{os.getloadavg()[0]:.1f}"))
            print(f"[step-cost-lmax] C = {channels}, L = {lmax}: r = {rows[-1]['r (each)']}", flush=True)
    rows = merged_rows(rows, args.molecule)
    shown = [{k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in r.items()} for r in rows]
    table = print_table(shown, list(shown[0]),
                        f"r = {PAIR[1]} / {PAIR[0]} training-step cost on {args.molecule} (gradient forces, batch "
                        f"{FULL.batch_size}), {threads} thread")
    save("step_cost_lmax", {"description": __doc__.split("\n")[0], "molecule": args.molecule, "rows": rows,
                            "tables": {"step-cost-lmax": table.split("\n", 2)[2]}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
