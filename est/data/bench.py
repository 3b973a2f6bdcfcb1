"""Loader throughput: samples/s of QM9 and OC20-layout LMDB reading, with and
without DataLoader workers (PyG collate), plus the pickled-record path
(fairchem files) with the restricted unpickler vs ``trusted=True``.

    python -m est.data.bench [--qm9-root PATH] [--lmdb PATH] [--workers 0,2] [--batches 50]

Without ``--lmdb`` a small EMT set is generated into a temporary folder.
Prints one JSON line per measurement (threads recorded).
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import tempfile
import time
from typing import Optional, Sequence

import torch


def _rate(loader, batches: int) -> dict:
    it = iter(loader)
    next(it)  # warm-up (worker start)
    n, t0 = 0, time.perf_counter()
    for _ in range(batches):
        try:
            b = next(it)
        except StopIteration:
            break
        n += b.num_graphs
    dt = time.perf_counter() - t0
    return {"samples_per_s": round(n / dt, 1), "samples": n}


def bench_dataset(name: str, ds, workers: Sequence[int], batch_size: int, batches: int) -> None:
    from torch_geometric.loader import DataLoader

    t0 = time.perf_counter()
    k = min(len(ds), 2000)
    for i in range(k):
        ds[i]
    raw = k / (time.perf_counter() - t0)
    print(json.dumps({"dataset": name, "mode": "getitem", "samples_per_s": round(raw, 1),
                      "threads": torch.get_num_threads()}), flush=True)
    for w in workers:
        loader = DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=w)
        r = _rate(loader, batches)
        print(json.dumps({"dataset": name, "mode": f"DataLoader(batch={batch_size}, workers={w})", **r,
                          "threads": torch.get_num_threads()}), flush=True)


def bench_model(name: str, ds, model_name: str, batch_size: int, steps: int = 5, **overrides) -> None:
    """Training-step rate (forward + backward + AdamW step) of a small est model on batches of ``ds``."""
    from torch_geometric.data import Batch

    try:
        from ..models import build_model

        model = build_model(model_name, **overrides)
    except Exception as exc:  # models are another package's business
        print(json.dumps({"dataset": name, "model": model_name, "skipped": f"{type(exc).__name__}: {exc}"}))
        return
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batches = [Batch.from_data_list([ds[(k * batch_size + j) % len(ds)] for j in range(batch_size)]) for k in range(steps + 1)]
    times = []
    for k, b in enumerate(batches):
        t0 = time.perf_counter()
        out = model(b)
        loss = sum(v.float().pow(2).mean() for v in out.values())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if k:  # first step warms up
            times.append(time.perf_counter() - t0)
    dt = sum(times) / len(times)
    print(json.dumps({"dataset": name, "model": model_name, "mode": f"train step (batch={batch_size})",
                      "steps_per_s": round(1 / dt, 2), "samples_per_s": round(batch_size / dt, 1),
                      "threads": torch.get_num_threads()}), flush=True)


def _pickled_copy(src, dst: str, n: int) -> None:
    """Copy n samples of ``src`` into a fairchem-style file of pickled PyG Data."""
    import lmdb
    from torch_geometric.data import Data

    env = lmdb.open(dst, subdir=False, map_size=1 << 32)
    with env.begin(write=True) as txn:
        for i in range(n):
            s = src[i]
            d = Data(pos=s.pos, atomic_numbers=s.atomic_numbers.float(), natoms=int(s.natoms), cell=s.cell,
                     tags=s.tags, fixed=s.fixed, y=float(s.energy), force=s.forces, sid=int(s.sid), fid=int(s.fid))
            txn.put(str(i).encode(), pickle.dumps(d, protocol=pickle.HIGHEST_PROTOCOL))
        txn.put(b"length", pickle.dumps(n))
    env.close()
    if os.path.exists(dst + "-lock"):
        os.remove(dst + "-lock")


def main(argv: Optional[Sequence[str]] = None) -> int:
    from .lmdb_io import LmdbDataset

    p = argparse.ArgumentParser(prog="python -m est.data.bench")
    p.add_argument("--qm9-root", default=None, help="QM9 source (default: installed qm9pack, skipped if absent)")
    p.add_argument("--lmdb", default=None, help="an S2EF folder (default: generate a small EMT set)")
    p.add_argument("--workers", default="0,2")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--batches", type=int, default=50)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model", default="eqv2-tiny", help="small est model for the step-rate comparison ('' to skip)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    workers = [int(w) for w in a.workers.split(",") if w != ""]
    try:
        from .qm9 import QM9

        qm9 = QM9(a.qm9_root, split="train", verbose=False)
        bench_dataset(f"QM9[{qm9.source}]", qm9, workers, a.batch_size, a.batches)
        if a.model:
            bench_model(f"QM9[{qm9.source}]", qm9, a.model, a.batch_size, num_targets=19, regress_forces=None,
                        use_pbc=False)
    except FileNotFoundError as exc:
        print(json.dumps({"dataset": "QM9", "skipped": str(exc)}))
    with tempfile.TemporaryDirectory() as tmp:
        path = a.lmdb
        if path is None:
            from .generate import generate

            out = os.path.join(tmp, "emt")
            generate(out, frames=600, verbose=False)
            path = os.path.join(out, "s2ef", "train")
        ds = LmdbDataset(path)
        bench_dataset("LMDB[est arrays]", ds, workers, a.batch_size, a.batches)
        if a.model:
            bench_model("LMDB[est arrays]", ds, a.model, a.batch_size)
        pk = os.path.join(tmp, "pickled.lmdb")
        _pickled_copy(ds, pk, min(len(ds), 1000))
        bench_dataset("LMDB[PyG pickles, restricted]", LmdbDataset(pk), workers[:1], a.batch_size, a.batches)
        bench_dataset("LMDB[PyG pickles, trusted]", LmdbDataset(pk, trusted=True), workers[:1], a.batch_size, a.batches)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
