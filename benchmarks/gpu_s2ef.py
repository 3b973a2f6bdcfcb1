"""GPU training throughput and peak memory at the S2EF-2M shape (83M): est vs fairchem's EquiformerV2.

One training step = forward (energy + direct forces) + OC20-like loss +
backward + AdamW step, on a batch of ``--slabs`` OC20-like Cu(111) slabs with
CO (``--size``, default 4x4x4 + CO = 66 atoms, OC20's mean is 78), in float32
and under bf16 autocast. Each model is built once; per precision (fresh AdamW): ``--warmup`` steps, then
``--steps`` timed steps (CUDA-synchronised wall time) -> steps/s, atoms/s;
peak memory = ``max_memory_allocated`` over the timed steps (parameters,
gradients and AdamW state included), and the part above what was allocated
before them (activations). Failures (OOM, autocast dtype errors) are recorded
and the run goes on; a wall-clock budget skips what would not fit.

Notes: fairchem's ``HydraModel`` runs its heads with autocast disabled
(``HeadInterface.use_amp`` is False), as fairchem does in training; est runs
everything under autocast.

    python benchmarks/gpu_s2ef.py --out-dir $OUT [--budget 300] [--models fairchem est-ffn est-default est-paper]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "baseline"))
import torch  # noqa: E402

import fairchem_eqv2 as fe  # noqa: E402
from bench_vs_fairchem import autocast, build, count_edges, loss_fn, num_params, oc20_slabs  # noqa: E402
from common import print_table  # noqa: E402


def run_model(variant, cfg, batch, *, precisions, warmup, steps, device="cuda", deadline=float("inf")):
    """Build ``variant`` once; one row per precision (fresh AdamW each)."""
    torch.manual_seed(0)
    t0 = time.perf_counter()
    try:
        model = build(variant, cfg, device).train()
    except Exception as err:  # noqa: BLE001
        traceback.print_exc()
        return [dict(model=variant, precision=p, note=f"build failed: {type(err).__name__}: {err}"[:160]) for p in precisions]
    build_s = time.perf_counter() - t0
    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    natoms = int(batch.natoms.sum())
    edges = count_edges(variant, model, batch)
    rows = []
    for prec in precisions:
        amp = None if prec == "fp32" else prec
        if time.perf_counter() > deadline:
            rows.append(dict(model=variant, precision=prec, note="skipped: time budget spent"))
            continue
        opt = torch.optim.AdamW(model.parameters(), lr=4e-4, weight_decay=1e-3)

        def step():
            opt.zero_grad(set_to_none=True)
            with autocast(device, amp):
                out = model(batch)
                loss = loss_fn(out, batch)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 100.0)
            opt.step()
            return loss

        try:
            loss = None
            for _ in range(warmup):
                loss = step()
            sync()
            base = torch.cuda.memory_allocated() if cuda else 0
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            for _ in range(steps):
                loss = step()
            sync()
            dt = time.perf_counter() - t0
            peak = torch.cuda.max_memory_allocated() if cuda else 0
            row = dict(model=variant, precision=prec, params_M=num_params(model) / 1e6, atoms=natoms, edges=edges,
                       build_s=build_s, step_ms=1e3 * dt / steps, steps_per_s=steps / dt, atoms_per_s=natoms * steps / dt,
                       peak_GB=peak / 2**30, activations_GB=(peak - base) / 2**30,
                       loss_finite=bool(torch.isfinite(loss).item()))
        except Exception as err:  # noqa: BLE001 - record (OOM, dtype errors) and go on
            traceback.print_exc()
            row = dict(model=variant, precision=prec, note=f"{type(err).__name__}: {err}"[:160])
        del opt, step
        if cuda:
            torch.cuda.empty_cache()
        print(json.dumps(row), flush=True)
        rows.append(row)
    del model
    if cuda:
        torch.cuda.empty_cache()
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", default=os.environ.get("OUT", "benchmarks/results"))
    ap.add_argument("--config", default="equiformer_v2-s2ef-2m")
    ap.add_argument("--models", nargs="+", default=["fairchem", "est-ffn", "est-default", "est-paper"])
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    ap.add_argument("--slabs", type=int, default=8)
    ap.add_argument("--size", type=int, nargs=3, default=(4, 4, 4))
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--budget", type=float, default=300.0, help="seconds; later runs are skipped past it")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of this script (no memory numbers)")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_s2ef.py: CUDA is not available (use --device cpu for a smoke test)")
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    t_start = time.perf_counter()
    models = list(args.models)
    have_fc = fe.available()
    if not have_fc:
        print(fe.unavailable_reason(), flush=True)
        models = [m for m in models if m != "fairchem"]
    cfg = fe.comparable_config(args.config)
    batch = oc20_slabs(args.slabs, tuple(args.size), device=args.device)
    print(f"{args.config}: {int(batch.natoms.sum())} atoms in {args.slabs} slabs, {gpu}, "
          f"torch {torch.__version__}, fairchem {fe.fairchem_version()}", flush=True)
    rows = []
    deadline = t_start + args.budget
    for m in models:  # in priority order; each model is built once for all precisions
        if time.perf_counter() > deadline:
            rows += [dict(model=m, precision=p, note=f"skipped: budget {args.budget:.0f}s spent") for p in args.precisions]
            continue
        rows += run_model(m, cfg, batch, precisions=args.precisions, warmup=args.warmup, steps=args.steps,
                          device=args.device, deadline=deadline)
    for prec in args.precisions:  # ratios vs fairchem at the same precision
        by = {r["model"]: r for r in rows if r["precision"] == prec and "step_ms" in r}
        fc = by.get("fairchem")
        for r in by.values():
            if fc:
                r["speedup_vs_fairchem"] = fc["step_ms"] / r["step_ms"]
                r["memory_vs_fairchem"] = r["peak_GB"] / fc["peak_GB"] if fc["peak_GB"] > 0 else float("nan")
    cols = ["model", "precision", "params_M", "atoms", "edges", "step_ms", "steps_per_s", "atoms_per_s",
            "speedup_vs_fairchem", "peak_GB", "activations_GB", "memory_vs_fairchem", "loss_finite", "build_s", "note"]
    table = print_table(rows, cols, f"S2EF-2M shape training step (fwd+bwd+AdamW), batch of {args.slabs} slabs, "
                                    f"{gpu}, {args.steps} timed steps after {args.warmup}")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload = dict(rows=rows, table=table, config=args.config, cfg=cfg.to_dict(), slabs=args.slabs, size=list(args.size),
                   steps=args.steps, warmup=args.warmup, torch=torch.__version__, gpu=gpu,
                   fairchem=fe.fairchem_version(), tf32=torch.backends.cuda.matmul.allow_tf32,
                   wall_s=time.perf_counter() - t_start)
    (out / "vs_fairchem_gpu_s2ef.json").write_text(json.dumps(payload, indent=1, default=str))
    (out / "vs_fairchem_gpu_s2ef.md").write_text(table + "\n")
    print(f"wrote {out / 'vs_fairchem_gpu_s2ef.json'} ({time.perf_counter() - t_start:.0f} s)")


if __name__ == "__main__":
    main()
