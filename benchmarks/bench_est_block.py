"""ESTBlock configurations side by side with EquiformerV2's FFN update.

Per configuration, at (L=6, C=128) and (L=4, C=128) with 1000 atoms:
forward + backward time (float32, median), memory saved for backward
(activations, from autograd's saved-tensor hooks; on GPU the peak allocated
memory), and the float64 equivariance error of the update ``block(x) - x`` in
eval mode (worst of 4 random rotations, relative). The baseline in the same
run is our SteerableFFN block (EquiformerV2's update: one steerable expert on
the 18x18 equiangular grid). This is the table that chose our default: the
spherical Transformer with its linear maps on the irreps ("irreps"
projections), MLP ratio 2, on a design of degree ``max(16, min(4L, max(3L, 18)))``,
attention logits bounded by 4 (the sweeps below vary the default, cap included).

    python benchmarks/bench_est_block.py [--quick] [--atoms 1000] [--device cpu]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table, rel_equivariance_error, save, setup_threads  # noqa: E402

from est.nn import ESTBlock, GridConfig, preset_config  # noqa: E402
from est.nn.est_block import default_degree  # noqa: E402
from est.so3 import random_rotation, wigner_D  # noqa: E402


def configs(L: int):
    """(name, config) pairs; a config equal to one already listed (e.g. the default among the sweeps) is
    listed once, under its first name."""
    seen = []
    for name, cfg in _configs(L):
        if cfg not in seen:
            seen.append(cfg)
            yield name, cfg


def _configs(L: int):
    eqv2_grid = GridConfig(kind="equiangular", resolution=(18, 18))
    common = dict(ffn_grid=eqv2_grid, ffn_hidden_channels=128)
    design = lambda t: GridConfig(kind="design", degree=t, normalization="quadrature")  # noqa: E731
    yield "EquiformerV2 FFN (baseline)", preset_config("default", lmax=L, channels=128, num_spherical_experts=0,
                                                       num_steerable_experts=1, **common)
    yield "EST paper preset", preset_config("paper", lmax=L, channels=128, **common)
    yield f"default: irreps proj., r=2, t={default_degree(L)}, logits < 4", preset_config("default", lmax=L,
                                                                                         channels=128)
    # the previous default: hybrid (FFN expert on t = max(3L, 18) + ST), per-point LayerNorms and linears, t = 3L
    previous = dict(num_steerable_experts=1, projections="points", mlp_ratio=4, ffn_hidden_channels=128,
                    ffn_grid=design(max(3 * L, 18)))
    yield "previous default: hybrid, per-point, t=3L", preset_config("default", lmax=L, channels=128, grid=design(3 * L),
                                                                      **previous)
    yield "per-point ST only, t=3L", preset_config("default", lmax=L, channels=128, grid=design(3 * L),
                                                    **dict(previous, num_steerable_experts=0))
    for t, r in [(3 * L, 2), (4 * L, 1), (4 * L, 2), (4 * L, 4), (default_degree(L), 1)]:
        yield f"irreps proj., r={r}, t={t}", preset_config("default", lmax=L, channels=128, grid=design(t), mlp_ratio=r)
    yield f"irreps proj., r=2, t={default_degree(L)}, 4 heads", preset_config("default", lmax=L, channels=128, num_heads=4)
    yield f"default without the logit cap (v1 default), t={default_degree(L)}", preset_config(
        "default", lmax=L, channels=128, logit_cap=None)
    yield f"irreps proj., r=2, t={default_degree(L)}, no encoding", preset_config("default", lmax=L, channels=128,
                                                                                   encoding="none")
    yield "default + FFN expert (hybrid)", preset_config("default", lmax=L, channels=128, num_steerable_experts=1)


def saved_bytes(fn) -> int:
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    out.sum().backward()
    return total


def interleaved_times(steps: dict, *, repeats: int, warmup: int = 1) -> dict:
    """Median seconds of each ``steps[name]()``, timed round-robin (one call of every config per round), so
    that load from other processes on a shared machine falls on all configs alike and the ratios stay fair."""
    import time

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    times = {name: [] for name in steps}
    for r in range(warmup + repeats):
        for name, step in steps.items():
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            if r >= warmup:
                times[name].append(time.perf_counter() - t0)
    return {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}


def measure_all(named_configs, *, atoms, device, repeats, rotations=4):
    """One row per config: fwd+bwd time (interleaved), saved memory, float64 eval equivariance error."""
    rows, blocks, steps = {}, {}, {}
    for name, cfg in named_configs:
        try:
            blocks[name] = ESTBlock(cfg).to(device).train()
        except ValueError as e:  # e.g. no shipped design of that degree
            rows[name] = dict(config=name, note=str(e)[:60])
            continue
        L, C = cfg.lmax, cfg.channels
        x = torch.randn(atoms, (L + 1) ** 2, C, device=device, requires_grad=True)
        batch = torch.arange(atoms, device=device) // 20  # molecules of 20 atoms
        steps[name] = (lambda b, x, batch: lambda: b(x, batch).sum().backward())(blocks[name], x, batch)
    times = interleaved_times(steps, repeats=repeats)
    for name, cfg in named_configs:
        if name in rows:
            continue
        block, L, C = blocks[name], cfg.lmax, cfg.channels
        x = torch.randn(atoms, (L + 1) ** 2, C, device=device)
        batch = torch.arange(atoms, device=device) // 20
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            steps[name]()
            mem = torch.cuda.max_memory_allocated() / 2**20
        else:
            mem = saved_bytes(lambda: block(x.requires_grad_(), batch)) / 2**20
        blk = block.double().cpu().eval()
        g = torch.Generator().manual_seed(0)
        x64 = torch.randn(50, (L + 1) ** 2, C, dtype=torch.float64, generator=g)
        err = rel_equivariance_error(lambda v: blk(v) - v, x64, wigner_D(L, random_rotation(rotations, generator=g)))
        S = block.spherical.sft.num_points if block.spherical is not None else 0
        rows[name] = dict(config=name, S=S, time_ms=1e3 * times[name], memory_mb=mem, equivariance=err)
    return [rows[name] for name, _ in named_configs]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="L=4 only, 200 atoms")
    ap.add_argument("--atoms", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds (every config once per round)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    threads = setup_threads()
    atoms = 200 if args.quick else args.atoms
    results = {}
    for L in ([4] if args.quick else [6, 4]):
        rows = measure_all(list(configs(L)), atoms=atoms, device=args.device, repeats=args.repeats)
        base = rows[0]
        for r in rows:
            if "time_ms" in r:
                r["time_vs_ffn"] = r["time_ms"] / base["time_ms"]
                r["memory_vs_ffn"] = r["memory_mb"] / base["memory_mb"]
        paper = next(r for r in rows if r["config"] == "EST paper preset")
        for r in rows:
            if "equivariance" in r:
                r["error_vs_paper"] = r["equivariance"] / paper["equivariance"]
        print_table(
            rows,
            ["config", "S", "time_ms", "time_vs_ffn", "memory_mb", "memory_vs_ffn", "equivariance", "error_vs_paper", "note"],
            f"ESTBlock at L={L}, C=128, {atoms} atoms, {args.device}, {threads} threads "
            "(fwd+bwd float32 median; memory = saved activations on CPU, peak on GPU; equivariance float64 eval)",
        )
        results[f"L{L}"] = rows
    save("est_block" + ("_quick" if args.quick else "") + ("_" + args.device if args.device != "cpu" else ""), results)


if __name__ == "__main__":
    main()
