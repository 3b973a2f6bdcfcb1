"""est vs fairchem's EquiformerV2 at identical hyperparameters: speed and memory.

For each shape (CPU sizes ``eqv2-tiny``/``eqv2-small`` up to the published 31M
and 83M shapes) the same :class:`~est.models.ModelConfig` builds

* ``fairchem``: fairchem-core 1.10.0's EquiformerV2 (backbone + energy/force
  heads, ``benchmarks/baseline/fairchem_eqv2.py``), the baseline;
* ``est-ffn``: est's EquiformerV2 (``update="ffn"``);
* ``est-default``: EST, our default preset; ``est-paper``: EST, the paper preset;
* ``est-spherical``: spherical experts only (``update="spherical"``).

Shapes use fairchem's fixed 600 Gaussians and a square grid
(``fairchem_eqv2.comparable_config``), so parameter counts agree exactly.
Inputs: OC20-like Cu(111) slabs with a CO adsorbate (ase ``fcc111``, periodic
in x, y, z like OC20), the same graph settings (cutoff, max_neighbors) for
both libraries.

Measured per model: training step (energy + direct forces, forward + backward,
a loss like OC20's: energy MAE + per-atom force L2) and inference (eval,
no_grad). Repeats are interleaved round-robin over the models (a busy machine
slows all of them alike); the table shows medians (``*_ms``), the fastest
round (``*_min_ms``, the least disturbed by other load) and the median CPU
time of the process (``*_cpu_ms``), with speedups for each. Memory: on CPU the bytes
autograd saves for backward during one training forward (saved-tensor hooks,
unique storages, parameters excluded); on GPU ``max_memory_allocated`` during
one training step minus the memory allocated before it.

    python benchmarks/bench_vs_fairchem.py [--quick] [--device cpu|cuda] [--amp bf16]
        [--shapes tiny small 31m 83m] [--slabs 2] [--threads 2]

Run with any Python: when fairchem is not importable here but
``benchmarks/.venv-fairchem`` exists, the script restarts under the venv's
Python; without it the baseline columns are skipped with a message
(build it with ``benchmarks/baseline/setup_fairchem.sh``).
"""
from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "baseline"))
import fairchem_eqv2 as fe  # noqa: E402

if __name__ == "__main__":
    fe.reexec_in_baseline_env()

import torch  # noqa: E402
from torch_geometric.data import Batch  # noqa: E402

from common import median_time, print_table, save, setup_threads  # noqa: E402

# shape key -> (registry name, graph overrides, slab size, default repeats)
SHAPES = {
    "tiny": ("eqv2-tiny", dict(cutoff=6.0, max_neighbors=20), (3, 3, 3), 7),
    "small": ("eqv2-small", dict(cutoff=6.0, max_neighbors=20), (3, 3, 4), 5),
    "31m": ("equiformer_v2-31m", dict(), (3, 3, 4), 3),
    "83m": ("equiformer_v2-s2ef-2m", dict(), (3, 3, 4), 2),
}
VARIANTS = {
    "fairchem": None,
    "est-ffn": dict(update="ffn"),
    "est-default": dict(update="est", est=dict(preset="default")),
    "est-paper": dict(update="est", est=dict(preset="paper")),
    "est-spherical": dict(update="spherical"),
}


def oc20_slabs(num: int, size=(3, 3, 4), *, device="cpu", seed: int = 0, vacuum: float = 7.5) -> Batch:
    """``num`` OC20-like Cu(111) slabs with CO, in our sample format (tags, fixed, pbc all True)."""
    import numpy as np
    from ase.build import add_adsorbate, fcc111, molecule

    from est.data.sample import make_sample

    datas = []
    for i in range(num):
        atoms = fcc111("Cu", size=size, vacuum=vacuum)
        n_slab = len(atoms)
        layer = atoms.get_tags()  # ase: 1 = top layer ... size[2] = bottom
        add_adsorbate(atoms, molecule("CO"), 1.9, ("fcc", "hcp", "ontop")[i % 3])
        rng = np.random.default_rng(seed + i)
        pos = atoms.positions + 0.05 * rng.standard_normal((len(atoms), 3))
        tags = np.concatenate([np.where(layer <= 2, 1, 0), np.full(len(atoms) - n_slab, 2)])
        fixed = np.concatenate([(layer > 2).astype(int), np.zeros(len(atoms) - n_slab, int)])
        datas.append(make_sample(pos=pos, atomic_numbers=atoms.numbers, cell=atoms.cell.array,
                                 pbc=[True, True, True], tags=tags, fixed=fixed,
                                 energy=[0.0], forces=np.zeros((len(atoms), 3)), sid=i))
    return Batch.from_data_list(datas).to(device)


def build(variant: str, cfg, device: str):
    from est.models import EquiformerV2

    if variant == "fairchem":
        model = fe.FairchemModel(cfg)
    else:
        model = EquiformerV2(cfg.replace(**VARIANTS[variant]))
    return model.to(device)


def num_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def count_edges(variant: str, model, batch) -> int:
    """Edges of the graph each library builds (must agree for a fair comparison)."""
    with torch.no_grad():
        if variant == "fairchem":
            bb = model.model.backbone
            g = bb.generate_graph(fe.boxed(batch, model.config.cutoff),
                                  enforce_max_neighbors_strictly=bb.enforce_max_neighbors_strictly)
            return int(g.edge_index.shape[1])
        cell = batch.cell.view(-1, 3, 3)
        frame = model.backbone.build_frame(batch.pos, batch.atomic_numbers, batch.batch, cell, batch.pbc.view(-1, 3))
        return int(frame.edge_index.shape[1]) if hasattr(frame, "edge_index") else -1


def loss_fn(out, batch):
    """OC20-like: energy MAE + per-atom force L2 (targets are zeros: only the cost matters)."""
    e = (out["energy"] - batch.energy.view(-1)).abs().mean()
    f = (out["forces"] - batch.forces).norm(dim=-1).mean()
    return 2.0 * e + 100.0 * f


def autocast(device: str, amp: str | None):
    if not amp:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device, dtype={"bf16": torch.bfloat16, "fp16": torch.float16}[amp])


def make_steps(model, batch, device, amp):
    def train_step():
        model.train()
        for p in model.parameters():
            p.grad = None
        with autocast(device, amp):
            out = model(batch)
            loss = loss_fn(out, batch)
        loss.backward()

    def infer_step():
        model.eval()
        with torch.no_grad(), autocast(device, amp):
            model(batch)

    return train_step, infer_step


def saved_bytes(model, batch, amp=None) -> int:
    """Bytes autograd saves for backward in one training forward (unique storages, parameters excluded)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        if t.device.type != "meta":
            s = t.untyped_storage()
            ptr = s.data_ptr()
            if ptr not in params:
                seen[ptr] = max(seen.get(ptr, 0), s.nbytes())
        return t

    model.train()
    for p in model.parameters():
        p.grad = None
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast(batch.pos.device.type, amp):
        out = model(batch)
        loss = loss_fn(out, batch)
    loss.backward()
    return sum(seen.values())


def gpu_peak_bytes(step) -> int:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def measure_shape(key: str, *, device: str, slabs: int, repeats: int | None, variants, amp=None,
                  infer: bool = True, log=print):
    """Time/memory of every variant at one shape; returns (rows, facts)."""
    name, graph, size, default_repeats = SHAPES[key]
    repeats = repeats or default_repeats
    cfg = fe.comparable_config(name, **graph)
    batch = oc20_slabs(slabs, size, device=device)
    natoms = int(batch.natoms.sum())
    rows, models = [], {}
    for v in variants:
        torch.manual_seed(0)
        t0 = time.perf_counter()
        try:
            models[v] = build(v, cfg, device)
        except Exception as err:  # noqa: BLE001 - report and go on
            rows.append(dict(shape=key, model=v, note=f"build failed: {type(err).__name__}: {err}"[:120]))
            continue
        log(f"[{key}] built {v} ({num_params(models[v]) / 1e6:.2f}M) in {time.perf_counter() - t0:.1f}s")
    steps = {v: make_steps(m, batch, device, amp) for v, m in models.items()}
    # warm-up (caches, lazy device attributes, allocator); on CPU the first training step is the
    # memory measurement (autograd's saved tensors)
    mem = {}
    for v, m in models.items():
        if device == "cuda":
            steps[v][0]()
            mem[v] = gpu_peak_bytes(steps[v][0])
        else:
            mem[v] = saved_bytes(m, batch, amp)
        if infer:
            steps[v][1]()
    times = {v: dict(train=[], infer=[], train_cpu=[], infer_cpu=[]) for v in models}

    def timed(v, kind, fn):
        c0 = time.process_time()  # CPU time of this process (all threads): robust to other load
        times[v][kind].append(median_time(fn, repeats=1, warmup=0))
        times[v][kind + "_cpu"].append(time.process_time() - c0)

    for r in range(repeats):  # round-robin: a busy machine slows every model alike
        for v in models:
            timed(v, "train", steps[v][0])
            if infer:
                timed(v, "infer", steps[v][1])
        log(f"[{key}] round {r + 1}/{repeats}: " + ", ".join(f"{v} {1e3 * times[v]['train'][-1]:.0f} ms" for v in models))
    for v, m in models.items():
        row = dict(
            shape=key, config=name, model=v, params_M=num_params(m) / 1e6, atoms=natoms,
            edges=count_edges(v, m, batch),
            train_ms=1e3 * statistics.median(times[v]["train"]),
            train_min_ms=1e3 * min(times[v]["train"]),
            train_cpu_ms=1e3 * statistics.median(times[v]["train_cpu"]),
            train_spread=(max(times[v]["train"]) - min(times[v]["train"])) / statistics.median(times[v]["train"]),
            memory_MB=mem[v] / 2**20,
        )
        row["atoms_per_s"] = natoms / (row["train_ms"] / 1e3)
        if infer:
            row["infer_ms"] = 1e3 * statistics.median(times[v]["infer"])
            row["infer_min_ms"] = 1e3 * min(times[v]["infer"])
            row["infer_cpu_ms"] = 1e3 * statistics.median(times[v]["infer_cpu"])
        row["train_times_ms"] = [1e3 * t for t in times[v]["train"]]
        rows.append(row)
    add_ratios(rows)
    facts = dict(shape=key, config=name, overrides=dict(graph), num_radial=cfg.num_radial,
                 grid_resolution=list(cfg.grid_resolution), slabs=slabs, slab_size=list(size), atoms=natoms,
                 repeats=repeats, amp=amp)
    del models
    return rows, facts


def add_ratios(rows):
    """Per-pair ratios: speedup vs fairchem (fairchem time / model time), memory vs fairchem, time vs est-ffn."""
    by = {r["model"]: r for r in rows if "train_ms" in r}
    fc, ffn = by.get("fairchem"), by.get("est-ffn")
    for r in by.values():
        if fc is not None:
            r["train_speedup_vs_fairchem"] = fc["train_ms"] / r["train_ms"]
            r["train_speedup_min"] = fc["train_min_ms"] / r["train_min_ms"]
            r["train_speedup_cpu"] = fc["train_cpu_ms"] / r["train_cpu_ms"]
            if "infer_ms" in r and "infer_ms" in fc:
                r["infer_speedup_vs_fairchem"] = fc["infer_ms"] / r["infer_ms"]
                r["infer_speedup_min"] = fc["infer_min_ms"] / r["infer_min_ms"]
            if fc["memory_MB"] > 0:
                r["memory_vs_fairchem"] = r["memory_MB"] / fc["memory_MB"]
        if ffn is not None:
            r["train_time_vs_est_ffn"] = r["train_ms"] / ffn["train_ms"]
            r["memory_vs_est_ffn"] = r["memory_MB"] / ffn["memory_MB"] if ffn["memory_MB"] > 0 else math.nan


def targets(rows):
    """The issue's speed/memory targets, one row per shape."""
    out = []
    for shape in dict.fromkeys(r["shape"] for r in rows):
        by = {r["model"]: r for r in rows if r["shape"] == shape and "train_ms" in r}
        if "fairchem" not in by:
            continue
        t = dict(shape=shape)
        if "est-ffn" in by:
            s, m = by["est-ffn"]["train_speedup_vs_fairchem"], by["est-ffn"]["memory_vs_fairchem"]
            t["ffn_speedup"] = s
            t["ffn_speedup_min"] = by["est-ffn"]["train_speedup_min"]
            t["ffn_speedup_cpu"] = by["est-ffn"]["train_speedup_cpu"]
            t["ffn_memory_ratio"] = m
            t["ffn_target(>=1.4x, mem<=1)"] = "met" if s >= 1.4 and m <= 1.0 else "MISSED"
        for v in ("est-default", "est-paper"):
            if v in by:
                s = by[v]["train_speedup_vs_fairchem"]
                t[f"{v}_speedup"] = s
                t[f"{v}_speedup_min"] = by[v]["train_speedup_min"]
                t[f"{v}_target(>=1x)"] = "met" if s >= 1.0 else "MISSED"
        out.append(t)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shapes", nargs="+", default=None, choices=list(SHAPES))
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--slabs", type=int, default=None, help="slabs per batch (default 2 on CPU for tiny/small, 1 for 31m/83m)")
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds (default per shape: 7/5/3/2)")
    ap.add_argument("--amp", choices=("bf16", "fp16"), default=None, help="autocast dtype (GPU)")
    ap.add_argument("--no-infer", dest="infer", action="store_false")
    ap.add_argument("--quick", action="store_true", help="tiny and small shapes only, 3 rounds")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None, help="results name (default vs_fairchem[_quick][_cuda][_bf16])")
    args = ap.parse_args(argv)
    threads = setup_threads(args.threads)
    t_start = time.perf_counter()
    shapes = args.shapes or (["tiny", "small"] if args.quick else list(SHAPES))
    variants = list(args.variants)
    have_fc = "fairchem" in variants and fe.available()
    if "fairchem" in variants and not have_fc:
        print(fe.unavailable_reason(), flush=True)
        variants.remove("fairchem")
    rows, facts = [], []
    for key in shapes:
        slabs = args.slabs or (2 if key in ("tiny", "small") or args.device != "cpu" else 1)
        repeats = args.repeats or (3 if args.quick else None)
        r, f = measure_shape(key, device=args.device, slabs=slabs, repeats=repeats, variants=variants,
                             amp=args.amp, infer=args.infer, log=lambda s: print(s, flush=True))
        rows += r
        facts.append(f)
        if args.device == "cuda":
            torch.cuda.empty_cache()
    mem_note = "peak allocated during a step (GPU)" if args.device == "cuda" else "saved for backward (CPU)"
    where = f"{args.device}, {threads} threads" + (f", autocast {args.amp}" if args.amp else ", float32")
    cols = ["shape", "model", "params_M", "atoms", "edges", "train_ms", "train_min_ms", "train_cpu_ms", "train_spread",
            "train_speedup_vs_fairchem", "train_speedup_min", "train_speedup_cpu", "train_time_vs_est_ffn",
            "infer_ms", "infer_min_ms", "infer_speedup_vs_fairchem", "infer_speedup_min",
            "memory_MB", "memory_vs_fairchem", "note"]
    tables = [print_table(rows, cols, f"est vs fairchem EquiformerV2, identical shapes ({where}; medians of "
                                      f"interleaved rounds; _min = fastest round, _cpu = process CPU time; memory = {mem_note})")]
    tgt = targets(rows)
    if tgt:
        tables.append(print_table(tgt, list(dict.fromkeys(k for t in tgt for k in t)), "Targets (issue 9), training step"))
    name = args.out or ("vs_fairchem" + ("_quick" if args.quick else "") + ("_" + args.device if args.device != "cpu" else "")
                        + ("_" + args.amp if args.amp else ""))
    path = save(name, dict(
        rows=rows, targets=tgt, shapes=facts, device=args.device, threads=threads, amp=args.amp,
        fairchem=fe.fairchem_version() if have_fc else None, baseline_note=None if have_fc else fe.unavailable_reason(),
        memory=mem_note, wall_s=time.perf_counter() - t_start, tables=tables,
    ))
    print(f"wrote {path} ({time.perf_counter() - t_start:.0f} s)")
    return rows


if __name__ == "__main__":
    main()
