#!/usr/bin/env python
"""Where the force study's EST step goes: one update block of each study model, with and without the
second-order backward of gradient forces, at the study's width and at EquiformerV2's.

The update block of layer 0 of ``study_forces.py``'s est models (``forces_setup.MODELS``: ``eqv2-tiny``,
L = 3, the models' own overrides), built through the model config, on ``--atoms``
atoms in 20-atom molecules, float32, one thread, timed round-robin
(``bench_est_block.interleaved_times``, median of ``--repeats`` rounds):

* ``fwd+bwd``: ``y = block(x)``, ``sum(y^2)`` backward (direct forces, energies);
* ``fwd+double bwd``: what a gradient-force training step asks of the block:
  ``g = d sum(y^2) / dx`` with ``create_graph=True``, then ``sum(g^2)`` backward.

Columns: milliseconds and the ratio to est's EquiformerV2 (``update="ffn"``,
the baseline row of each width; ``est-ffn 18x18``: the same block on
EquiformerV2's published 18 x 18 grid instead of the tiny shape's 10 x 9),
the spherical Transformer's points ``S``,
and the three operators with the most self CPU time in one double-backward
call (``torch.profiler``), which show what the time is spent on. Widths:
``C = 32`` (the study's, FFN hidden 64) and ``C = 128`` (EquiformerV2's, FFN
hidden 128).

    python benchmarks/bench_update_cost.py [--atoms 320] [--repeats 7]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "baseline"))

from bench_est_block import interleaved_times  # noqa: E402
from common import print_table, save, setup_threads  # noqa: E402

MODELS = ("est-ffn", "est-default", "est-t14", "est-ffn 18x18")
#: rows that are a study model with other overrides: EquiformerV2's FFN on its published 18 x 18 grid (the
#: study's eqv2-tiny shape samples 10 x 9 = 90 points, EquiformerV2's models 18 x 18 = 324)
VARIANTS = {"est-ffn 18x18": ("est-ffn", ["model.grid_resolution=[18,18]"])}
#: (channels, FFN hidden channels): the study's eqv2-tiny width and EquiformerV2's
WIDTHS = ((32, 64), (128, 128))


def update_block(model: str, channels: int, ffn_hidden: int):
    """Layer 0's update block of the study model ``model`` at the given width (random weights, train mode)."""
    from forces_setup import random_model

    model, extra = VARIANTS.get(model, (model, []))
    net = random_model(model, f"model.channels={channels}", f"model.ffn_hidden_channels={ffn_hidden}", *extra)
    return next(m for name, m in net.named_modules() if name.endswith("update_blocks.0")).train()


def steps(block, x0: torch.Tensor, batch: torch.Tensor) -> dict:
    """The two timed calls of one block (module docstring)."""
    def first():
        x = x0.clone().requires_grad_(True)
        (block(x, batch) ** 2).sum().backward()

    def second():
        x = x0.clone().requires_grad_(True)
        g, = torch.autograd.grad((block(x, batch) ** 2).sum(), x, create_graph=True)
        (g ** 2).sum().backward()

    return {"fwd+bwd": first, "fwd+double bwd": second}


def top_ops(fn, n: int = 3) -> str:
    """The ``n`` operators with the most self CPU time in one call of ``fn``, with their share."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events)
    return ", ".join(f"{e.key.removeprefix('aten::')} {100 * e.self_cpu_time_total / total:.0f}%" for e in events[:n])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--atoms", type=int, default=320, help="atoms in 20-atom molecules (320: the study's batch of 16)")
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    threads = setup_threads(1)
    batch = torch.arange(args.atoms) // 20
    rows, tables = [], []
    for channels, ffn_hidden in WIDTHS:
        torch.manual_seed(0)
        blocks = {m: update_block(m, channels, ffn_hidden) for m in MODELS}
        x0 = torch.randn(args.atoms, 16, channels)  # [N, (L+1)^2, C], L = 3
        calls = {(m, kind): fn for m, b in blocks.items() for kind, fn in steps(b, x0, batch).items()}
        times = interleaved_times(calls, repeats=args.repeats)
        width_rows = []
        for m, b in blocks.items():
            row = {"C": channels, "model": m, "S": b.spherical.sft.num_points if b.spherical is not None else "-"}
            for kind in ("fwd+bwd", "fwd+double bwd"):
                row[f"{kind} ms"] = f"{1e3 * times[(m, kind)]:.1f}"
                row[f"{kind} / ffn"] = f"{times[(m, kind)] / times[(MODELS[0], kind)]:.2f}"
            row["top ops, double bwd"] = top_ops(calls[(m, "fwd+double bwd")])
            width_rows.append(row)
        rows += width_rows
        tables.append(print_table(width_rows, list(width_rows[0]),
                                  f"Update block of the force study's models, L = 3, C = {channels}, {args.atoms} atoms, "
                                  f"float32, {threads} thread, median of {args.repeats} interleaved rounds"))
    save("update_cost", {"description": __doc__.split("\n")[0], "atoms": args.atoms, "repeats": args.repeats,
                         "rows": rows, "tables": {"update-cost": "\n\n".join(t.split("\n", 2)[2] for t in tables)}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
