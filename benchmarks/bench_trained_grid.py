"""A trained EST model on finer spherical designs: same weights, accuracy, rotation error and cost.

The EST default's weights act on irreps coefficients, so a checkpoint can be
evaluated on any spherical design (``est.train.load_trained_model(...,
model_overrides={"est": {"grid": {"degree": t}}})``, or
``ESTCalculator(..., model_overrides=...)``). Training can sharpen the attention
beyond what the training design resolves (the softmax of the logits is not
band-limited); a finer design then samples the same continuous attention with
less aliasing. For each checkpoint and design degree this prints, side by side
with the trained design in the same run:

* test force MAE (meV/A) and mean |F_t - F_trained| (meV/A),
* the float64 rotation error of the forces on the first test frame
  (``est.testing.check_model``, random rotations then refined),
* the time of one batch (energy and gradient forces) relative to the trained design
  (one thread, median of ``--repeats``).

    python benchmarks/bench_trained_grid.py --checkpoint runs/forces/ethanol/est-default-s0 \\
        --data /work/data/xtb/ethanol/test --degrees 20 24

Results: ``benchmarks/results/trained_grid.json`` (``--out``).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median_time, print_table, save, trained_rotation_error  # noqa: E402


def evaluate(checkpoint: str, degree: int | None, frames: list, batch_size: int) -> tuple[torch.nn.Module, torch.Tensor]:
    """The checkpoint on design ``degree`` (None: as trained), float64, and its forces (eV/A) on ``frames``."""
    from torch_geometric.data import Batch

    from est.train import load_trained_model

    overrides = None if degree is None else {"est": {"grid": {"degree": degree}}}
    model, ck = load_trained_model(checkpoint, model_overrides=overrides)
    model = model.double().eval()
    std = float(ck["normalizers"]["energy_std"])  # forces = -dE/dx of the normalised energy
    forces = []
    for i in range(0, len(frames), batch_size):
        b = Batch.from_data_list(frames[i:i + batch_size])
        b.pos = b.pos.double()
        forces.append(std * model(b)["forces"].detach())  # [n, 3]
    return model, torch.cat(forces)


def points(model) -> int:
    return model.backbone.update_blocks[0].spherical.sft.num_points


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", nargs="+", required=True, help="est.train checkpoints or run folders")
    p.add_argument("--data", required=True, help="test LMDB (file or folder of shards) with forces")
    p.add_argument("--degrees", nargs="+", type=int, default=[20, 24], help="designs besides the trained one")
    p.add_argument("--frames", type=int, default=200, help="test frames for the MAE")
    p.add_argument("--batch-size", type=int, default=25)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default="trained_grid")
    args = p.parse_args(argv)
    torch.set_num_threads(1)

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
        for degree in [None, *args.degrees]:
            model, f = evaluate(ck, degree, frames, args.batch_size)
            base = f if base is None else base
            rot = trained_rotation_error(model, (("frame", frames[0]),), "forces", f"{Path(ck).name} t={degree}")
            models[degree] = model
            rows.append(dict(checkpoint=str(ck), degree="trained" if degree is None else degree, points=points(model),
                             force_mae_meV_A=1000 * float((f - true).abs().mean()),
                             change_meV_A=1000 * float((f - base).abs().mean()), rotation_error=rot["frame"]))
        times = {d: [] for d in models}  # round-robin, so that the machine's load falls on all designs alike
        for _ in range(args.repeats):
            for d, model in models.items():
                times[d].append(median_time(lambda: model(batch)["forces"], repeats=1, warmup=1))  # noqa: B023
        for row, d in zip(rows[-len(models):], models):
            row["time_vs_trained"] = statistics.median(times[d]) / statistics.median(times[None])
    text = print_table(rows, ["checkpoint", "degree", "points", "force_mae_meV_A", "change_meV_A", "rotation_error",
                              "time_vs_trained"], "trained model on finer designs")
    path = save(args.out, dict(description=__doc__.split("\n\n")[0], data=args.data, frames=len(frames), rows=rows,
                               table=text))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
