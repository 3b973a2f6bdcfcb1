"""A trained est model on finer spherical designs or message grids: same weights, accuracy, rotation error and cost.

The EST default's weights act on irreps coefficients, so a checkpoint can be
evaluated on any spherical design (``est.train.load_trained_model(...,
model_overrides={"est": {"grid": {"degree": t}}})``, or
``ESTCalculator(..., model_overrides=...)``). Training can sharpen the attention
beyond what the training design resolves (the softmax of the logits is not
band-limited); a finer design then samples the same continuous attention with
less aliasing. The SO(2) message block samples its edge features on a
``grid_resolution`` lat x lon grid (10 x 9 in the ``eqv2-tiny`` shape) for its
pointwise activation; ``--message-grids 18x18`` evaluates the same weights on a
finer one (``model_overrides={"grid_resolution": [18, 18]}``), for any est model,
``update="ffn"`` included; ``--joint`` evaluates every design on every message
grid too. For each checkpoint and variant (design degree or
message grid) this prints, side by side with the trained model in the same run:

* test force MAE (meV/A) and mean |F_t - F_trained| (meV/A),
* the float64 rotation error of the forces on the first test frame
  (``est.testing.check_model``, random rotations then refined),
* the time of one batch (energy and gradient forces) relative to the trained design
  (one thread, median of ``--repeats``).

    python benchmarks/bench_trained_grid.py --checkpoint runs/forces/ethanol/est-default-s0 \\
        --data /work/data/xtb/ethanol/test --degrees 20 24
    python benchmarks/bench_trained_grid.py --checkpoint runs/forces/aspirin/est-ffn-s0 \\
        --data /work/data/xtb/aspirin/test --degrees --message-grids 18x18 --out trained_grid_messages

Results: ``benchmarks/results/trained_grid.json`` (``--out``). Rows of other checkpoints already stored
there, measured on the same data and number of frames, are kept (a later seed's checkpoints add to the
table); a checkpoint measured again replaces its rows.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median_time, print_table, save, trained_rotation_error, with_stored_rows  # noqa: E402


def variants(degrees: list[int], message_grids: list[str], *,
             joint: bool = False) -> list[tuple[str | int, dict | None]]:
    """``(label, model_overrides)`` of each evaluation, the trained model first; a design's label is its degree.

    ``joint``: then every design on every message grid as well (label ``"<degree>, messages LATxLON"``),
    to tell the design's share of the error from the message grid's.
    """
    def design(d: int) -> dict:
        return {"est": {"grid": {"degree": d}}}

    out: list[tuple[str | int, dict | None]] = [("trained", None)]
    out += [(d, design(d)) for d in degrees]
    grids = []
    for g in message_grids:
        lat, _, lon = g.lower().partition("x")
        if not (lat.isdigit() and lon.isdigit()):
            raise SystemExit(f"--message-grids: {g!r} is not LATxLON, e.g. 18x18")
        grids.append((f"messages {lat}x{lon}", [int(lat), int(lon)]))
    out += [(label, {"grid_resolution": res}) for label, res in grids]
    if joint:
        out += [(f"{d}, {label}", {**design(d), "grid_resolution": res})
                for d in degrees for label, res in grids]
    return out


def evaluate(checkpoint: str, overrides: dict | None, frames: list, batch_size: int) -> tuple[torch.nn.Module, torch.Tensor]:
    """The checkpoint with ``model_overrides`` (None: as trained), float64, and its forces (eV/A) on ``frames``."""
    from torch_geometric.data import Batch

    from est.train import load_trained_model

    model, ck = load_trained_model(checkpoint, model_overrides=overrides)
    model = model.double().eval()
    std = float(ck["normalizers"]["energy_std"])  # forces = -dE/dx of the normalised energy
    forces = []
    for i in range(0, len(frames), batch_size):
        b = Batch.from_data_list(frames[i:i + batch_size])
        b.pos = b.pos.double()
        forces.append(std * model(b)["forces"].detach())  # [n, 3]
    return model, torch.cat(forces)


def points(model) -> int | None:
    """Points of the EST block's spherical design; None for a model without one (``update="ffn"``)."""
    spherical = model.backbone.update_blocks[0].spherical  # every update block is an ESTBlock; None without the sphere
    return None if spherical is None else spherical.sft.num_points


def merged_rows(out: str, rows: list[dict], *, data: str, frames: int) -> list[dict]:
    """The stored rows of ``results/<out>.json`` whose checkpoint is not in ``rows``, then ``rows``; only
    rows measured on the same ``data`` and number of ``frames`` are kept."""
    return with_stored_rows(out, rows, lambda r: r["checkpoint"], same={"data": data, "frames": frames})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", nargs="+", required=True, help="est.train checkpoints or run folders")
    p.add_argument("--data", required=True, help="test LMDB (file or folder of shards) with forces")
    p.add_argument("--degrees", nargs="*", type=int, default=[20, 24],
                   help="designs besides the trained one (none: give the flag without values)")
    p.add_argument("--message-grids", nargs="*", default=[], metavar="LATxLON",
                   help="message-block grids besides the trained one, e.g. 18x18")
    p.add_argument("--joint", action="store_true",
                   help="also every design with every message grid (which of the two sets the error)")
    p.add_argument("--frames", type=int, default=200, help="test frames for the MAE")
    p.add_argument("--batch-size", type=int, default=25)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default="trained_grid")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    todo = variants(args.degrees, args.message_grids, joint=args.joint)

    from torch_geometric.data import Batch

    from est.data import LmdbDataset

    test = LmdbDataset(args.data)
    frames = [test[i] for i in range(min(args.frames, len(test)))]
    true = torch.cat([f.forces for f in frames]).double()  # [n, 3] eV/A
    rows = []
    for ck in args.checkpoint:
        batch = Batch.from_data_list(frames[: args.batch_size])
        batch.pos = batch.pos.double()
        models, base = {}, None
        for label, overrides in todo:
            model, f = evaluate(ck, overrides, frames, args.batch_size)
            base = f if base is None else base
            rot = trained_rotation_error(model, (("frame", frames[0]),), "forces", f"{Path(ck).name} {label}")
            models[label] = model
            rows.append(dict(checkpoint=str(ck), degree=label, points=points(model),
                             force_mae_meV_A=1000 * float((f - true).abs().mean()),
                             change_meV_A=1000 * float((f - base).abs().mean()), rotation_error=rot["frame"]))
        times = {d: [] for d in models}  # round-robin, so that the machine's load falls on all designs alike
        for _ in range(args.repeats):
            for d, model in models.items():
                times[d].append(median_time(lambda: model(batch)["forces"], repeats=1, warmup=1))  # noqa: B023
        for row, d in zip(rows[-len(models):], models):
            row["time_vs_trained"] = statistics.median(times[d]) / statistics.median(times["trained"])
    rows = merged_rows(args.out, rows, data=args.data, frames=len(frames))
    text = print_table(rows, ["checkpoint", "degree", "points", "force_mae_meV_A", "change_meV_A", "rotation_error",
                              "time_vs_trained"], "trained model on finer designs and message grids")
    path = save(args.out, dict(description=__doc__.split("\n\n")[0], data=args.data, frames=len(frames), rows=rows,
                               table=text))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
