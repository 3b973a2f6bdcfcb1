"""Shared helpers for the benchmark scripts: timing, tables, JSON output."""
from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def setup_threads(n: int | None = None) -> int:
    """Fix the CPU thread count (recorded in every table)."""
    n = n or int(os.environ.get("EST_BENCH_THREADS", min(2, os.cpu_count() or 1)))
    torch.set_num_threads(n)
    return n


def median_time(fn, *, repeats: int = 5, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` in seconds (synchronising CUDA if used)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def print_table(rows: list[dict], columns: list[str], title: str) -> str:
    """Print rows as a Markdown table; returns the text."""
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3g}" if (abs(v) < 1e-2 or abs(v) >= 1e4) and v != 0 else f"{v:.4g}"
        return str(v)

    lines = [f"### {title}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |")
    text = "\n".join(lines)
    print(text + "\n", flush=True)
    return text


def save(name: str, payload: dict) -> Path:
    """Write ``benchmarks/results/<name>.json`` with machine facts."""
    RESULTS.mkdir(exist_ok=True)
    payload = dict(payload)
    payload["machine"] = dict(
        python=platform.python_version(),
        torch=torch.__version__,
        processor=platform.processor() or platform.machine(),
        threads=torch.get_num_threads(),
        cuda=torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    )
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=1, default=str))
    return path


def rel_equivariance_error(f, x: torch.Tensor, Ds: torch.Tensor) -> float:
    """max over rotations of ``||f(D x) - D f(x)|| / ||D f(x)||``."""
    worst = 0.0
    with torch.no_grad():
        fx = f(x)
        for D in Ds:
            ref = D @ fx
            worst = max(worst, float((f(D @ x) - ref).norm() / ref.norm()))
    return worst
