r"""MACE on the expressivity tasks: a tensor-product model with many-body messages in one layer.

Runs in the MACE venv (``benchmarks/baseline/setup_mace.sh``; MACE pins e3nn
0.4.4, so it never enters est's environment). ``benchmarks/study_expressivity.py``
writes a task's graphs to JSON and calls this script through
``mace_baseline.run_in_venv(..., script=...)``; the training loop and the
separation measure are est's own (``est/testing/expressivity/protocol.py``,
plain torch, loaded here by its path), so MACE is trained exactly as the est
and e3nn rows are.

Model: ``mace.modules.MACE`` as ``run_train --model=MACE`` builds it (first
interaction ``RealAgnosticInteractionBlock``, then
``RealAgnosticResidualInteractionBlock``; 8 Bessel functions, polynomial
cutoff p = 5, radial MLP [64, 64, 64], SiLU gate, e3nn's generalised
Clebsch-Gordan coefficients, ``use_reduced_cg=False``; where e3nn 0.4.4 has
no table, L = 4 at correlation 3, MACE takes them from ``cuequivariance``,
which ``setup_mace.sh`` installs for that reason), with spherical harmonics
and hidden irreps up to ``lmax`` (``C x 0e + C x 1o + C x 2e + ...``),
``correlation`` (default 3: each layer's product basis is a polynomial of
degree 3 in the neighbour density, body order 4), ``avg_num_neighbors`` the
task's mean degree and ``r_max`` the study's cutoff. The graph's own edges are
used (no cutoff graph). Readout as est's invariant readout: the last layer's
``C x 0e`` features summed over each graph's nodes, then Linear -> SiLU ->
Linear to the logits. MACE's last layer (and its only layer when there is
one) keeps scalars only, so it has no equivariant readout of one layer: the
``rotsym`` task is not run for it.

    python mace_expressivity.py train --task T.json --seed 0 --lmax 4 --layers 1 --channels 16 --json OUT
    python mace_expressivity.py separation --task T.json --seeds 3 --lmax 4 --layers 1 --channels 16 --json OUT

Task JSON: ``{"graphs": [{"pos": [[x, y, z], ...], "atomic_numbers": [...],
"edge_index": [[src...], [dst...]], "y": int}, ...], "num_classes": int,
"mean_degree": float, "cutoff": float}``.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("est_expressivity_protocol",
                                               ROOT / "est" / "testing" / "expressivity" / "protocol.py")
protocol = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(protocol)


class MaceClassifier(nn.Module):
    """``MACE`` features of the last layer's scalars, summed per graph, to ``num_classes`` logits."""

    def __init__(self, *, atomic_numbers: list[int], lmax: int, num_layers: int, channels: int, correlation: int,
                 r_max: float, avg_num_neighbors: float, num_classes: int) -> None:
        super().__init__()
        from mace.modules import MACE, interaction_classes  # first: importing mace lets e3nn 0.4.4 load its tables
        from e3nn import o3

        self.zs = sorted(set(int(z) for z in atomic_numbers))
        hidden = o3.Irreps("+".join(f"{channels}x{l}{'e' if l % 2 == 0 else 'o'}" for l in range(lmax + 1)))
        self.mace = MACE(
            r_max=r_max, num_bessel=8, num_polynomial_cutoff=5, max_ell=lmax,
            interaction_cls=interaction_classes["RealAgnosticResidualInteractionBlock"],
            interaction_cls_first=interaction_classes["RealAgnosticInteractionBlock"],
            num_interactions=num_layers, num_elements=len(self.zs), hidden_irreps=hidden,
            MLP_irreps=o3.Irreps("16x0e"), atomic_energies=np.zeros(len(self.zs)),
            avg_num_neighbors=avg_num_neighbors, atomic_numbers=self.zs, correlation=correlation,
            gate=nn.functional.silu, radial_MLP=[64, 64, 64],
            use_reduced_cg=False,  # run_train's default (the class's own default is True)
        )
        last = o3.Irreps(str(self.mace.products[-1].linear.irreps_out))
        if last != o3.Irreps(f"{channels}x0e"):
            raise RuntimeError(f"expected MACE's last layer to output {channels}x0e, got {last}")
        self.channels = channels
        self.head = nn.Sequential(nn.Linear(channels, channels), nn.SiLU(), nn.Linear(channels, num_classes))

    def collate(self, graphs: list[dict], dtype: torch.dtype) -> dict:
        """MACE's input dict for ``graphs`` (one batch; the graphs' own edges, no periodic shifts)."""
        pos, src, dst, attrs, batch, ptr, offset = [], [], [], [], [], [0], 0
        for b, g in enumerate(graphs):
            p = torch.tensor(g["pos"], dtype=dtype)  # [n, 3]
            e = torch.tensor(g["edge_index"], dtype=torch.long)  # [2, E]
            pos.append(p)
            src.append(e[0] + offset)
            dst.append(e[1] + offset)
            idx = torch.tensor([self.zs.index(int(z)) for z in g["atomic_numbers"]])  # [n]
            attrs.append(nn.functional.one_hot(idx, len(self.zs)).to(dtype))  # [n, elements]
            batch.append(torch.full((p.shape[0],), b, dtype=torch.long))
            offset += p.shape[0]
            ptr.append(offset)
        edge_index = torch.stack([torch.cat(src), torch.cat(dst)])  # [2, E]; MACE: sender, receiver
        n_edges = edge_index.shape[1]
        return dict(positions=torch.cat(pos), edge_index=edge_index, node_attrs=torch.cat(attrs),
                    batch=torch.cat(batch), ptr=torch.tensor(ptr), shifts=torch.zeros(n_edges, 3, dtype=dtype),
                    unit_shifts=torch.zeros(n_edges, 3, dtype=dtype), cell=torch.zeros(len(graphs), 3, 3, dtype=dtype),
                    labels=torch.tensor([int(g["y"]) for g in graphs]))

    def forward(self, data: dict) -> torch.Tensor:
        data = {k: v for k, v in data.items() if k != "labels"}
        data["positions"] = data["positions"].detach().clone()  # MACE sets requires_grad on it
        out = self.mace(data, training=self.training, compute_force=False)
        h = out["node_feats"][:, -self.channels:]  # [N, C]: the last layer's scalars
        num_graphs = int(data["ptr"].numel() - 1)
        pooled = h.new_zeros(num_graphs, self.channels).index_add_(0, data["batch"], h)  # [B, C]
        return self.head(pooled)  # [B, classes]


def _build(task: dict, args, dtype: torch.dtype) -> MaceClassifier:
    torch.set_default_dtype(dtype)  # MACE builds its coupling tables in the default dtype
    zs = [z for g in task["graphs"] for z in g["atomic_numbers"]]
    model = MaceClassifier(atomic_numbers=zs, lmax=args.lmax, num_layers=args.layers, channels=args.channels,
                           correlation=args.correlation, r_max=task["cutoff"],
                           avg_num_neighbors=task["mean_degree"], num_classes=task["num_classes"])
    return model.to(dtype)


def train(task: dict, args) -> dict:
    """One seed of est's protocol (``protocol.fit``), float32 as the other rows."""
    dtype = torch.float32
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    model = _build(task, args, dtype)
    batches = [model.collate([g], dtype) for g in task["graphs"]]
    everything = model.collate(task["graphs"], dtype)

    @torch.no_grad()
    def accuracy(m: nn.Module) -> float:
        was = m.training
        m.eval()
        pred = m(everything).argmax(dim=-1)  # [B]
        m.train(was)
        return 100.0 * float((pred == everything["labels"]).double().mean())

    res = protocol.fit(model, batches, [b["labels"] for b in batches], logits=lambda m, b: m(b), accuracy=accuracy,
                       seed=args.seed, epochs=args.epochs, lr=args.lr)
    return dict(seed=args.seed, accuracy=res["accuracy"], final=res["final_accuracy"],
                seconds=time.perf_counter() - t0)


def _rotations(n: int, gen: torch.Generator) -> torch.Tensor:
    """``[n, 3, 3]`` Haar-random rotations (QR of Gaussian matrices, signs fixed, det +1)."""
    q, r = torch.linalg.qr(torch.randn(n, 3, 3, dtype=torch.float64, generator=gen))
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[:, None, :]
    q[torch.linalg.det(q) < 0, :, 0] *= -1
    return q


@torch.no_grad()
def separation(task: dict, args) -> dict:
    """est's separation measure at initialisation (float64): ``per_seed`` d and ``floor_per_seed``."""
    labels = [int(g["y"]) for g in task["graphs"]]
    sep, floor = [], []
    for seed in range(args.seeds):
        torch.manual_seed(seed)
        model = _build(task, args, torch.float64).eval()
        z = model(model.collate(task["graphs"], torch.float64))  # [B, classes]
        sep.append(protocol.class_separation(z, labels))
        zr = torch.stack([model(model.collate([dict(g, pos=(torch.tensor(g["pos"], dtype=torch.float64) @ R.T).tolist())
                                               for g in task["graphs"]], torch.float64))
                          for R in _rotations(args.rotations, torch.Generator().manual_seed(seed))])  # [R, B, classes]
        floor.append(protocol.rotation_floor(z, zr))
    return dict(per_seed=sep, floor_per_seed=floor, seeds=list(range(args.seeds)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["train", "separation"])
    ap.add_argument("--task", required=True, help="the task's graphs (JSON, see the module docstring)")
    ap.add_argument("--lmax", type=int, required=True)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--channels", type=int, default=16)
    ap.add_argument("--correlation", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seeds", type=int, default=3, help="separation: initialisations")
    ap.add_argument("--rotations", type=int, default=4, help="separation: rotations for the floor")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", required=True, help="write the result here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    task = json.loads(Path(args.task).read_text())
    result = train(task, args) if args.command == "train" else separation(task, args)
    tmp = f"{args.json}.tmp-{os.getpid()}"
    Path(tmp).write_text(json.dumps(result))
    os.replace(tmp, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
