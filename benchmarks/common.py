"""Shared helpers for the benchmark scripts: timing, tables, JSON output."""
from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from est.data.cache import atomic_text

RESULTS = Path(__file__).resolve().parent / "results"
#: the studies' ``est-uncapped`` model: the EST default without its bound on the attention logits (the
#: default before model defaults v2, est.models.config.MODEL_DEFAULTS_VERSION), and its label in the tables
EST_UNCAPPED = ["model.update=est", "model.est.preset=default", "model.est.logit_cap=0"]
EST_UNCAPPED_LABEL = "EST default without the logit cap (the default before v2)"


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

    text = f"### {title}\n\n" + markdown_table([{c: fmt(r.get(c, "")) for c in columns} for r in rows], columns)
    print(text + "\n", flush=True)
    return text


def dash_missing(rows: list[dict]) -> list[dict]:
    """``rows`` with every cell formatted as ``"nan"`` shown as ``-`` (no value), for :func:`print_table`."""
    return [{k: ("-" if v == "nan" else v) for k, v in r.items()} for r in rows]


def save_figure(fig, path: Path, *, title: str | None = None, fontsize: int = 9) -> Path:
    """``fig`` (matplotlib) with ``title`` on top, laid out tight, as a PNG at 110 dpi in ``path``; closed. A figure
    legend (``fig.legend``, e.g. below the axes) is kept inside the image."""
    import matplotlib.pyplot as plt

    if title:
        fig.suptitle(title, fontsize=fontsize)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight" if fig.legends else None)
    plt.close(fig)
    return Path(path)


def markdown_table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    """Rows as a Markdown table (missing cells empty), not printed."""
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def mean_sd(vals: list[float], scale: float = 1.0) -> str:
    """``mean ± sd`` of ``vals * scale`` (nan dropped; one value alone; ``-`` for none)."""
    vals = [v * scale for v in vals if not math.isnan(v)]
    if not vals:
        return "-"
    m = statistics.fmean(vals)
    digits = 3 if abs(m) < 100 else 4
    if len(vals) == 1:
        return f"{m:.{digits}g}"
    return f"{m:.{digits}g} ± {statistics.stdev(vals):.2g}"


def paired(recs: list[dict], base: list[dict], key: str) -> tuple[list[float], int]:
    """Per-seed ratios ``recs`` / ``base`` (e.g. fairchem) of ``metrics[key]`` (same seed), and how many are below 1."""
    by_seed = {r["seed"]: r["metrics"][key] for r in base}
    ratios = [r["metrics"][key] / by_seed[r["seed"]] for r in recs if r["seed"] in by_seed]
    return ratios, sum(x < 1 for x in ratios)


def results_file(name: str) -> Path:
    """``benchmarks/results/<name>.json``: a study's or bench's results."""
    return RESULTS / f"{name}.json"


def load(name: str) -> dict | None:
    """``benchmarks/results/<name>.json``, or None when it does not exist."""
    path = results_file(name)
    return json.loads(path.read_text()) if path.exists() else None


def with_stored_rows(name: str, rows: list[dict], key: Callable[[dict], Any], *, same: dict[str, Any]) -> list[dict]:
    """The rows of ``results/<name>.json`` whose ``key`` is not among ``rows``' keys, then ``rows``: a bench
    re-measures some cases and keeps the others. Only a file whose top-level fields ``same`` equal those given
    (the data, frames or molecule they were measured on) lends rows; otherwise ``rows`` alone."""
    stored = load(name) or {}
    if any(stored.get(k) != v for k, v in same.items()):
        return list(rows)
    new = {key(r) for r in rows}
    return [r for r in stored.get("rows", []) if key(r) not in new] + list(rows)


def save(name: str, payload: dict, *, machine: bool = True) -> Path:
    """Write ``benchmarks/results/<name>.json`` (atomically) with this machine's facts (``machine=False``: a
    re-rendering that ran nothing here keeps the payload's own)."""
    payload = dict(payload)
    if machine:
        payload["machine"] = dict(
            python=platform.python_version(),
            torch=torch.__version__,
            processor=platform.processor() or platform.machine(),
            threads=torch.get_num_threads(),
            cuda=torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        )
    path = results_file(name)
    atomic_text(path, json.dumps(payload, indent=1, default=str))
    return path


def lock_file(path: Path) -> Path:
    """The lock beside a results file: ``<folder>/.<name>.lock`` (ignored by git)."""
    path = Path(path)
    return path.with_name(f".{path.name}.lock")


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold the exclusive lock on the results file ``path`` (waiting while another driver holds it) for one
    read-merge-write: drivers run side by side, one per core and hours each, and two that end together would
    otherwise each merge their runs into the file as it was before the other wrote, and the second write would
    drop the first's runs. Released when the block ends, or when the process dies."""
    import fcntl  # POSIX: here, not at the top, so the benchmarks that merge nothing import on any system

    lock = lock_file(path)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def merge_runs(name: str, runs: dict[str, dict[str, list[dict]]], *, compatible,
               stored: dict | None = None) -> dict[str, dict[str, list[dict]]]:
    """``runs`` (``{group: {model: [record, ...]}}``, records with a ``"seed"``) merged into the runs stored
    in ``benchmarks/results/<name>.json``, so that a call with a subset of the models or seeds does not drop
    the others: a stored (group, model, seed) this call did not produce is kept, one it did produce is
    replaced. Nothing is kept unless ``compatible(stored_payload)`` (same options and budget). ``stored``: that
    payload when the caller has loaded it already."""
    stored = stored if stored is not None else load(name) or {}
    if not stored or not compatible(stored):
        return runs
    merged = {g: {m: list(recs) for m, recs in models.items()} for g, models in stored.get("runs", {}).items()}
    for g, models in runs.items():
        for m, recs in models.items():
            new = {r["seed"] for r in recs}
            kept = [r for r in merged.get(g, {}).get(m, []) if r["seed"] not in new]
            merged.setdefault(g, {})[m] = sorted(kept + list(recs), key=lambda r: r["seed"])
    return merged


def rel_equivariance_error(f, x: torch.Tensor, Ds: torch.Tensor) -> float:
    """max over rotations of ``||f(D x) - D f(x)|| / ||D f(x)||``."""
    worst = 0.0
    with torch.no_grad():
        fx = f(x)
        for D in Ds:
            ref = D @ fx
            worst = max(worst, float((f(D @ x) - ref).norm() / ref.norm()))
    return worst


# ------------------------------------------------------------------ studies: one subprocess per run
def launch(jobs: list[tuple], *, command, run_dir, parallel: int, fresh: bool = False,
           env: dict[str, str] | None = None, tag: str = "study") -> None:
    """Run each job without a ``run_dir(job)/result.json`` (all with ``fresh``) as a subprocess, ``parallel`` at a time.

    ``command(job)`` is the job's argv; its output goes to ``run_dir(job)/study.log``. Every child
    gets one BLAS/OpenMP thread plus ``env``. A job whose result appears meanwhile (another
    driver) is skipped; a failed job is reported and the others go on.
    """
    import subprocess
    import sys

    pending = list(jobs)
    running: list = []
    child_env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", **(env or {}))
    while pending or running:
        while pending and len(running) < parallel:
            job = pending.pop(0)
            rd = Path(run_dir(job))
            if (rd / "result.json").exists() and not fresh:
                continue
            rd.mkdir(parents=True, exist_ok=True)
            log = open(rd / "study.log", "w")
            running.append((subprocess.Popen(command(job), stdout=log, stderr=subprocess.STDOUT, env=child_env), job, log))
            print(f"[{tag}] started {job} (log {rd / 'study.log'})", flush=True)
        time.sleep(2)
        for proc, job, log in list(running):
            if proc.poll() is not None:
                log.close()
                running.remove((proc, job, log))
                state = "done" if proc.returncode == 0 else f"FAILED (exit {proc.returncode}, see its study.log)"
                print(f"[{tag}] {job} {state}", flush=True)
        sys.stdout.flush()


def write_result(rd: Path, rec: dict) -> None:
    """``rd/result.json``, one finished run's record, written atomically: a run killed while writing it leaves
    no half record behind (which :func:`launch` would skip and :func:`load_results` could not read) and is run
    again."""
    atomic_text(Path(rd) / "result.json", json.dumps(rec, indent=1, default=str))


def load_results(jobs: list[tuple], run_dir) -> dict[str, dict[str, list[dict]]]:
    """``{group: {model: [record, ...]}}`` from the ``run_dir(job)/result.json`` of each ``(group, model, seed)`` job that has one."""
    out: dict[str, dict[str, list[dict]]] = {}
    for job in jobs:
        f = Path(run_dir(job)) / "result.json"
        if f.exists():
            out.setdefault(job[0], {}).setdefault(job[1], []).append(json.loads(f.read_text()))
    return out


def trained_rotation_error(subject, samples, output: str, name: str, *, num_rotations: int = 6,
                           refine_steps: int = 6) -> dict:
    """Largest relative rotation error of ``output`` over random (then refined) rotations, per sample.

    ``subject``: a trained model (cast to float64, eval) or a callable ``est.testing.check_model``
    accepts; ``samples``: ``(label, sample)`` pairs. Returns ``{"output": output, label: error, ...}``.
    """
    from est.testing import check_model

    out: dict = {"output": output}
    for label, sample in samples:
        rep = check_model(subject, sample, checks=["rotation"], num_rotations=num_rotations, refine_steps=refine_steps,
                          name=f"{name}/{label}")
        rows = [r for r in rep.rows if r.output == output and r.expected]
        out[label] = max(r.max_rel for r in rows)
        print(f"[{name}] trained {output} rotation error on the {label}: {out[label]:.2e}", flush=True)
    return out
