#!/usr/bin/env python
"""ESTBlock equivariance error and cost against the number of sphere points S (the t-design degree t).

For each L, our default block (``preset_config("default")``) with the
spherical Transformer on the shipped t-design of degree t (S points), from
the minimum t = 2L (exact linear round trip) upward; the steerable experts
stay on their default grid. Per row: the float64 equivariance error of the
update ``block(x) - x`` (eval, worst of 4 random rotations, relative; it does
not depend on the input scale: the spherical path is pre-normalised), and the
float32 forward+backward time relative to the FFN-only block (EquiformerV2's
update) measured in the same run. The default's row is marked.

    python benchmarks/bench_block_vs_S.py [--lmax 2 3 4 6] [--atoms 400]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_est_block import measure  # noqa: E402  (time, memory, equivariance of one block config)
from common import print_table, save, setup_threads  # noqa: E402

from est.nn import GridConfig, preset_config  # noqa: E402


def degrees(L: int) -> list[int]:
    return sorted(t for t in {2 * L, 3 * L, 4 * L, 5 * L, 6 * L, 12, 18, 24, 30} if 2 * L <= t <= 30)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lmax", nargs="+", type=int, default=[2, 3, 4, 6])
    ap.add_argument("--channels", type=int, default=64)
    ap.add_argument("--atoms", type=int, default=400)
    args = ap.parse_args(argv)
    threads = setup_threads()
    C, rows = args.channels, []
    for L in args.lmax:
        torch.manual_seed(0)
        base = measure("ffn", preset_config("default", lmax=L, channels=C, num_spherical_experts=0),
                       atoms=args.atoms, device="cpu", repeats=3)["time_ms"]
        default_t = preset_config("default", lmax=L, channels=C).grid.degree
        for t in degrees(L):
            torch.manual_seed(0)
            r = measure(f"t={t}", preset_config("default", lmax=L, channels=C, grid=GridConfig(kind="design", degree=t)),
                        atoms=args.atoms, device="cpu", repeats=3)
            rows.append(dict(L=L, t=t, S=r["S"], default="yes" if t == default_t else "",
                             equivariance_error=r["equivariance"], time_vs_ffn=r["time_ms"] / base, time_ms=r["time_ms"]))
            print(f"[block-vs-S] L={L} t={t} S={r['S']}: error {r['equivariance']:.1e}, {r['time_ms'] / base:.2f}x the FFN",
                  flush=True)
    text = print_table(rows, ["L", "t", "S", "default", "equivariance_error", "time_vs_ffn", "time_ms"],
                       f"ESTBlock vs S (C={C}, {args.atoms} atoms, CPU {threads} threads; error float64 eval, time fwd+bwd "
                       "float32 relative to the FFN-only block in the same run)")
    save("block_vs_S", dict(rows=rows, tables=[text], args=vars(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
