"""Benchmark est.geometry.radius_graph against ase.neighborlist (and PyG's
radius_graph when its compiled backend is importable), in one run.

Cases (reference.md section 5 quotes ~1 ms and ~6 ms as achievable):
  * 32 QM9-sized molecules (random bonded clouds of 10-29 atoms, see
    qm9_like; no download), cutoff 5 A;
  * 64 fcc(111) Cu slabs, 4x4x5 = 80 atoms, rattled, pbc=(T, T, F),
    cutoff 6 A, max_neighbors 20 (ase has no truncation: it builds the full
    list, so its timing is a lower bound for an ase-based pipeline).

Usage: python benchmarks/bench_graph.py [--threads 2] [--repeats 20]
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch
from ase import Atoms
from ase.build import fcc111
from ase.neighborlist import neighbor_list

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from est.geometry import edge_rotation, radius_graph


def _timeit(fn, repeats, warmup=3):
    for _ in range(warmup):
        fn()
    ts, cs = [], []
    for _ in range(repeats):
        c = time.process_time()
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
        cs.append(time.process_time() - c)
    return statistics.median(ts) * 1e3, statistics.median(cs) * 1e3


def qm9_like(n_graphs, rng):
    """QM9-sized random molecules: 10-29 atoms (mean ~19.5; QM9's is 18), each
    atom bonded to an earlier one at 1.0-1.5 A, no pair closer than 0.95 A."""
    mols = []
    for _ in range(n_graphs):
        n = int(rng.integers(10, 30))
        pos = [np.zeros(3)]
        while len(pos) < n:
            v = rng.normal(size=3)
            p = pos[int(rng.integers(len(pos)))] + v / np.linalg.norm(v) * rng.uniform(1.0, 1.5)
            if min(np.linalg.norm(q - p) for q in pos) > 0.95:
                pos.append(p)
        mols.append(Atoms("C" * n, positions=np.array(pos)))
    return mols


def slabs(n_graphs, rng):
    out = []
    for i in range(n_graphs):
        s = fcc111("Cu", (4, 4, 5), vacuum=7.0)
        s.rattle(0.05, seed=int(rng.integers(1 << 30)))
        out.append(s)
    return out


def to_batch(atoms_list, dtype):
    pos = torch.tensor(np.concatenate([a.positions for a in atoms_list]), dtype=dtype)
    batch = torch.repeat_interleave(torch.arange(len(atoms_list)), torch.tensor([len(a) for a in atoms_list]))
    cell = torch.tensor(np.stack([np.array(a.cell) if a.pbc.any() else np.zeros((3, 3)) for a in atoms_list]),
                        dtype=dtype)
    pbc = torch.tensor(np.stack([a.pbc for a in atoms_list]))
    return pos, batch, cell, pbc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    print(f"torch {torch.__version__}, torch.set_num_threads({torch.get_num_threads()}), "
          f"median of {args.repeats} repeats")

    try:
        from torch_geometric.nn import radius_graph as pyg_radius_graph

        pyg_radius_graph(torch.zeros(2, 3), 1.0)
    except Exception as exc:  # pyg-lib / torch-cluster not installed (expected here)
        pyg_radius_graph = None
        pyg_reason = type(exc).__name__

    rows = []
    mols = qm9_like(32, rng)
    sl = slabs(64, rng)
    clusters = []
    for a in sl:  # the same 80-atom slabs as isolated clusters (no images): reference.md's 64 x 80 figure
        c = a.copy()
        c.pbc = False
        clusters.append(c)
    cases = [
        ("32 QM9-size molecules", mols, 5.0, None),
        ("64 x 80-atom clusters, no PBC", clusters, 6.0, 20),
        ("64 Cu slabs x 80 atoms", sl, 6.0, 20),
        ("64 Cu slabs x 80 atoms (no max_nb)", sl, 6.0, None),
    ]
    for name, atoms_list, cutoff, max_nb in cases:
        natoms = sum(len(a) for a in atoms_list)
        for dtype in (torch.float32, torch.float64):
            pos, batch, cell, pbc = to_batch(atoms_list, dtype)
            periodic = bool(pbc.any())
            kw = dict(batch=batch, cell=cell if periodic else None, pbc=pbc if periodic else None,
                      max_neighbors=max_nb)
            g = radius_graph(pos, cutoff, **kw)
            ms = _timeit(lambda: radius_graph(pos, cutoff, **kw), args.repeats)
            rows.append((name, f"est radius_graph {str(dtype)[6:]}", ms, g.edge_index.shape[1]))
        posg = pos.requires_grad_()
        ms = _timeit(lambda: edge_rotation(radius_graph(posg, cutoff, **kw).edge_vec).sum().backward(),
                     max(3, args.repeats // 2))
        rows.append((name, "est graph+edge_rotation fwd+bwd f64", ms, g.edge_index.shape[1]))
        n_ase = sum(len(neighbor_list("i", a, cutoff)) for a in atoms_list)
        ms = _timeit(lambda: [neighbor_list("ijS", a, cutoff) for a in atoms_list], max(3, args.repeats // 4), 1)
        rows.append((name, "ase neighbor_list (loop, full list)", ms, n_ase))
        if pyg_radius_graph is not None and not periodic:
            ms = _timeit(lambda: pyg_radius_graph(pos, cutoff, batch=batch, max_num_neighbors=10_000), args.repeats)
            rows.append((name, "PyG radius_graph", ms, None))
        else:
            why = "periodic cells unsupported" if periodic and pyg_radius_graph is not None else \
                f"not importable: {pyg_reason}" if pyg_radius_graph is None else ""
            rows.append((name, f"PyG radius_graph skipped ({why})", None, None))
        rows.append((name, f"  [{len(atoms_list)} graphs, {natoms} atoms]", None, None))

    w = max(len(r[1]) for r in rows)
    print(f"{'case':36s} {'method':{w}s} {'wall ms':>9s} {'cpu ms':>9s} {'edges':>8s}")
    for case, meth, ms, e in rows:
        wall, cpu = ("", "") if ms is None else (f"{ms[0]:9.2f}", f"{ms[1]:9.2f}")
        print(f"{case:36s} {meth:{w}s} {wall:>9s} {cpu:>9s} {'' if e is None else e:>8}")
    print("wall = median wall-clock per call; cpu = median process CPU time per call (all threads; "
          "robust to a loaded machine). ase builds the full list (no max_neighbors truncation).")


if __name__ == "__main__":
    main()
