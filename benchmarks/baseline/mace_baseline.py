r"""MACE (mace-torch) as the outside baseline: export, train, evaluate, NVE MD.

MACE lives in its own environment (``benchmarks/baseline/setup_mace.sh``, default
``benchmarks/.venv-mace``; mace-torch pins e3nn 0.4.4, est needs a newer one),
so this file imports only the standard library and numpy at module level and
splits its work by environment:

=============  ===================  =====================================================
command        runs in              does
=============  ===================  =====================================================
``export``     est's environment    OC20-layout LMDB folder -> extended XYZ
``train``      either (it starts    ``python -m mace.cli.run_train`` under the MACE venv,
               the MACE venv)       ``OMP_NUM_THREADS=threads``, resumable
``evaluate``   MACE venv            energy / force errors of a trained model on an xyz
``md``         MACE venv            NVE through ``MACECalculator``: drift, bonds intact
=============  ===================  =====================================================

Commands (from the repository root)::

    bash benchmarks/baseline/setup_mace.sh                       # once, about 4 minutes
    python benchmarks/baseline/mace_baseline.py export --lmdb DATA/train --out runs/mace/train.xyz
    python benchmarks/baseline/mace_baseline.py export --lmdb DATA/test --out runs/mace/test.xyz
    python benchmarks/baseline/mace_baseline.py train --train runs/mace/train.xyz \
        --test runs/mace/test.xyz --run-dir runs/mace/s0 --seed 0 --epochs 50 --threads 1
    benchmarks/.venv-mace/bin/python benchmarks/baseline/mace_baseline.py evaluate \
        --model runs/mace/s0/mace.model --xyz runs/mace/test.xyz --json runs/mace/s0/test_metrics.json
    benchmarks/.venv-mace/bin/python benchmarks/baseline/mace_baseline.py md \
        --model runs/mace/s0/mace.model --xyz runs/mace/test.xyz --steps 20000 --json runs/mace/s0/md.json

From a study script in est's environment (see :func:`run_in_venv`)::

    import mace_baseline as mb
    mb.export_xyz(lmdb_dir, "train.xyz")
    info = mb.train(mb.MaceTrainConfig(seed=0, epochs=50), train_xyz=..., test_xyz=..., run_dir=...)
    metrics = mb.run_in_venv("evaluate", "--model", info["model"], "--xyz", test_xyz)
    md = mb.run_in_venv("md", "--model", info["model"], "--xyz", test_xyz, "--steps", "20000")
    curve = mb.learning_curve(run_dir)  # valid MAE vs optimiser steps and seconds

Model (issue 17's "small published-style size", :class:`MaceTrainConfig`):
``MACE`` with 2 interactions, 64 channels, hidden irreps up to L=2
(``64x0e + 64x1o + 64x2e``), correlation order 3, edge harmonics up to
``max_ell`` 3, r_max 5 A, E0s ``average`` (a least-squares fit of the training
energies on element counts). Training follows MACE 0.3.16's own defaults
unless stated: ``--loss weighted`` =
``w_E * mean((dE / N)^2) + w_F * mean(|dF|^2)`` with ``w_E = 1``, ``w_F = 100``
(its argparse defaults), Adam with AMSGrad, lr 0.01, ReduceLROnPlateau,
EMA of the weights (decay 0.99, as in MACE's README example), batch 10,
float64 (MACE's training default), 5 % of the training file held out for
validation (the checkpoint kept is the one with the lowest validation loss).

Metrics (:func:`force_metrics`, the same definitions as est's trainer): energy
MAE per structure (meV) and per atom (mean of ``|dE| / N``, meV/atom), force
MAE over all components (meV/A), force cosine (mean over atoms of
``cos(F_pred, F_ref)``). NVE drift (:func:`nve_md`, any ASE calculator): the
slope of a least-squares line through the total energy, meV/atom/ps; a
molecule is intact when no bond (a pair closer than 1.2 x the sum of covalent
radii in the reference geometry) ever exceeds 1.5 x its reference length.

Caveats (MACE 0.3.16 behaviour, seen here):

* float64 is MACE's training default and about 2x the cost of float32 at L=2
  (``--default-dtype float32`` to change; the calculator must use the same).
* For one molecule every frame has the same composition, so the ``average``
  E0 fit is rank one: MACE's least-squares answer splits the mean energy over
  the elements arbitrarily (minimum norm); only the sum per molecule is right.
* The checkpoint MACE keeps (and ``--restart_latest`` resumes from) is the
  epoch with the lowest validation loss, saved with the EMA weights. MACE
  restarts *at* the checkpoint's epoch, so a plain restart trains that epoch a
  second time on weights that have already seen it: one extra epoch per
  restart. :func:`train` renames the checkpoint to the next epoch before it
  resumes (:func:`resume_after_checkpoint`), so a resumed run redoes only the
  epochs after it, whose work the checkpoint does not hold; the learning
  curve counts every optimiser step the weights saw, a redone epoch of a run
  resumed the plain way twice (:func:`learning_curve`). A restart also starts
  MACE's best-loss tracking afresh, so a resumed run's final model is its best
  checkpoint since the last restart.
* e3nn 0.4.4 loads its constants with ``torch.load``; on torch >= 2.6 that
  needs ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``, which ``import mace`` sets, so
  import mace before e3nn in the MACE venv.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
VENV = Path(os.environ.get("EST_MACE_VENV", ROOT / "benchmarks" / ".venv-mace"))
MISSING = "MACE environment missing: run benchmarks/baseline/setup_mace.sh (MACE rows skipped)"

#: extxyz keys MACE reads by default (mace.tools.default_keys); plain ``energy``/``forces``
#: would be taken by ASE's SinglePointCalculator on reading
ENERGY_KEY = "REF_energy"
FORCES_KEY = "REF_forces"
#: the name passed to ``--name``; the trained model is ``RUN_DIR/mace.model``
RUN_NAME = "mace"
#: written by :func:`train` next to MACE's own outputs
TRAIN_RECORD = "est_train.json"
#: config fields a rerun may change: more epochs continue from the latest checkpoint
_RESUMABLE = ("epochs", "threads", "keep_freed_memory")
#: in ``RUN_DIR/checkpoints``: the checkpoints :func:`resume_after_checkpoint` renamed
RESUME_NOTE = "est_resume.json"
_CHECKPOINT = re.compile(r"^(?P<tag>.+)_epoch-(?P<epoch>\d+)(?P<swa>_swa)?\.pt$")


# ----------------------------------------------------------------------------- environment
def venv_python() -> Path:
    return VENV / "bin" / "python"


def available() -> bool:
    """True when the MACE venv exists (``setup_mace.sh`` has run)."""
    return venv_python().exists()


#: the environment form of ``est.train.malloc.keep_freed_memory``: no ``mmap`` for large blocks, heap kept
#: up to 2 GiB free at its top (glibc reads these when the process starts; other C libraries ignore them)
KEEP_FREED_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1)}


def _thread_env(threads: int, keep_freed_memory: bool = False) -> Dict[str, str]:
    """The MACE process's environment: ``threads`` threads, and glibc's allocator as asked (the
    :data:`KEEP_FREED_ENV` variables set, else removed, so the caller's shell does not decide it)."""
    env = {k: v for k, v in os.environ.items() if k not in KEEP_FREED_ENV}
    if keep_freed_memory:
        env.update(KEEP_FREED_ENV)
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[k] = str(threads)
    # the MACE venv must not see est's checkout on PYTHONPATH (it has no est, and e3nn differs)
    env.pop("PYTHONPATH", None)
    return env


def run_in_venv(command: str, *args: str, threads: int = 1, timeout: Optional[float] = None,
                script: str | os.PathLike | None = None) -> Dict[str, Any]:
    """Run ``SCRIPT COMMAND ARGS --threads N --json TMP`` under the MACE venv; its JSON result.

    ``script`` defaults to this file (``evaluate``, ``md``: both import mace);
    ``mace_expressivity.py`` takes the same trailing options. Raises
    ``RuntimeError`` with the tail of the output when the command fails,
    ``FileNotFoundError`` when the venv is missing.
    """
    if not available():
        raise FileNotFoundError(f"{venv_python()} not found; {MISSING}")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out, log = os.path.join(tmp, "result.json"), os.path.join(tmp, "output.log")
        argv = [str(venv_python()), str(Path(script or __file__).resolve()), command, *map(str, args),
                "--threads", str(threads), "--json", out]
        code = _run_child(argv, env=_thread_env(threads), log=log, timeout=timeout)
        if code != 0 or not os.path.exists(out):
            tail = Path(log).read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{' '.join(argv)} failed (exit {code}):\n{tail}")
        with open(out, encoding="utf-8") as f:
            return json.load(f)


def _run_child(argv: Sequence[str], *, env: Dict[str, str], log: str | os.PathLike, cwd=None,
               timeout: Optional[float] = None) -> int:
    """Run ``argv`` with stdout + stderr appended to ``log``; its exit code.

    The child gets SIGTERM when this process dies (Linux) and is terminated
    when this one is interrupted or ``timeout`` passes (``TimeoutExpired``),
    so no MACE process outlives the script that started it.
    """
    with open(log, "a", encoding="utf-8") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                                preexec_fn=_die_with_parent)
        try:
            return proc.wait(timeout=timeout)
        except BaseException:
            proc.terminate()
            proc.wait()
            raise


# ----------------------------------------------------------------------------- export (est side)
def export_xyz(lmdb_path: str | os.PathLike, out: str | os.PathLike, *, limit: Optional[int] = None,
               start: int = 0) -> Dict[str, Any]:
    """Write an est OC20-layout LMDB (file or folder), or its samples ``start .. start + limit - 1``, as extended XYZ for MACE.

    Per frame: positions (A), atomic numbers, ``info[REF_energy]`` (eV),
    ``arrays[REF_forces]`` (eV/A), ``info[sid]``/``info[fid]``; the cell and
    periodicity are kept only for periodic samples (molecules are written
    without a lattice, ``pbc = F F F``). The file is written under a temporary
    name and renamed, so a killed export leaves nothing half written.
    Returns ``{"path", "frames", "atoms"}``.
    """
    from ase import Atoms
    from ase.io import write
    from est.data import LmdbDataset

    ds = LmdbDataset(lmdb_path)
    if not 0 <= start < len(ds):
        raise ValueError(f"{lmdb_path}: start={start} outside its {len(ds)} samples")
    n = len(ds) - start if limit is None else min(int(limit), len(ds) - start)
    if n <= 0:
        raise ValueError(f"{lmdb_path}: no samples to export (limit={limit})")
    frames = []
    for i in range(start, start + n):
        s = ds[i]
        if getattr(s, "energy", None) is None or getattr(s, "forces", None) is None:
            raise ValueError(f"{lmdb_path} sample {i}: no energy/forces; MACE training needs both (S2EF frames)")
        pbc = s.pbc.reshape(-1).numpy().astype(bool)  # [3]
        atoms = Atoms(numbers=s.atomic_numbers.numpy(), positions=s.pos.double().numpy(),
                      cell=s.cell.reshape(3, 3).double().numpy() if pbc.any() else None, pbc=pbc)
        atoms.info[ENERGY_KEY] = float(s.energy.reshape(-1)[0])
        atoms.info["sid"] = int(s.sid.reshape(-1)[0]) if getattr(s, "sid", None) is not None else i
        atoms.info["fid"] = int(s.fid.reshape(-1)[0]) if getattr(s, "fid", None) is not None else 0
        atoms.arrays[FORCES_KEY] = s.forces.double().numpy().reshape(-1, 3)  # [n, 3]
        frames.append(atoms)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    write(str(tmp), frames, format="extxyz")
    os.replace(tmp, out)
    return {"path": str(out), "frames": n, "atoms": int(sum(len(a) for a in frames))}


# ----------------------------------------------------------------------------- training
@dataclass(kw_only=True)
class MaceTrainConfig:
    """What :func:`train` passes to ``mace.cli.run_train`` (see module docstring)."""

    seed: int = 0
    epochs: int = 50
    threads: int = 1
    num_interactions: int = 2
    num_channels: int = 64
    max_L: int = 2
    correlation: int = 3
    max_ell: int = 3
    r_max: float = 5.0
    batch_size: int = 10
    lr: float = 0.01
    loss: str = "weighted"
    energy_weight: float = 1.0
    forces_weight: float = 100.0
    e0s: str = "average"
    ema_decay: Optional[float] = 0.99  # None: no EMA
    default_dtype: str = "float64"
    valid_fraction: float = 0.05
    eval_interval: int = 1
    #: glibc keeps freed memory in the MACE process (:func:`_thread_env`); speed only, the results are the same
    keep_freed_memory: bool = False

    def __post_init__(self) -> None:
        if self.default_dtype not in ("float32", "float64"):
            raise ValueError(f"default_dtype={self.default_dtype!r}; MACE trains in 'float32' or 'float64'")
        if self.epochs < 1 or self.batch_size < 1 or self.threads < 1:
            raise ValueError(f"epochs, batch_size and threads must be >= 1 (got {self.epochs}, "
                             f"{self.batch_size}, {self.threads})")

    def steps_per_epoch(self, n_train_file: int, *, valid_given: bool = False) -> int:
        """Optimiser steps per epoch: MACE drops the last partial batch; the validation share comes first."""
        n = n_train_file if valid_given else n_train_file - int(round(self.valid_fraction * n_train_file))
        return n // self.batch_size

    def epochs_for_steps(self, steps: int, n_train_file: int, *, valid_given: bool = False) -> int:
        """The fewest epochs with at least ``steps`` optimiser steps (MACE counts epochs only)."""
        per = self.steps_per_epoch(n_train_file, valid_given=valid_given)
        if per < 1:
            raise ValueError(f"{n_train_file} training frames give no full batch of {self.batch_size}")
        return math.ceil(steps / per)


def train_argv(cfg: MaceTrainConfig, *, train_xyz: str, test_xyz: Optional[str], run_dir: str,
               valid_xyz: Optional[str] = None) -> List[str]:
    """``mace.cli.run_train`` arguments for ``cfg`` (always ``--restart_latest``: a rerun resumes)."""
    argv = [
        f"--name={RUN_NAME}", f"--work_dir={run_dir}", f"--seed={cfg.seed}", "--device=cpu",
        f"--default_dtype={cfg.default_dtype}", f"--train_file={train_xyz}",
        f"--energy_key={ENERGY_KEY}", f"--forces_key={FORCES_KEY}", f"--E0s={cfg.e0s}",
        "--model=MACE", f"--num_interactions={cfg.num_interactions}", f"--num_channels={cfg.num_channels}",
        f"--max_L={cfg.max_L}", f"--correlation={cfg.correlation}", f"--max_ell={cfg.max_ell}",
        f"--r_max={cfg.r_max}", f"--batch_size={cfg.batch_size}", f"--valid_batch_size={cfg.batch_size}",
        f"--max_num_epochs={cfg.epochs}", f"--lr={cfg.lr}", f"--loss={cfg.loss}",
        f"--energy_weight={cfg.energy_weight}", f"--forces_weight={cfg.forces_weight}",
        f"--eval_interval={cfg.eval_interval}", "--restart_latest", "--plot=False", "--save_cpu",
    ]
    argv.append(f"--valid_file={valid_xyz}" if valid_xyz else f"--valid_fraction={cfg.valid_fraction}")
    if test_xyz:
        argv.append(f"--test_file={test_xyz}")
    if cfg.ema_decay is not None:
        argv += ["--ema", f"--ema_decay={cfg.ema_decay}"]
    return argv


def _count_frames(xyz: str) -> int:
    """Frames in an extxyz file (first line of each frame is the atom count)."""
    n, lines = 0, open(xyz, encoding="utf-8")
    with lines:
        while True:
            head = lines.readline()
            if not head.strip():
                return n
            k = int(head)
            lines.readline()
            for _ in range(k):
                lines.readline()
            n += 1


def train(cfg: MaceTrainConfig, *, train_xyz: str, test_xyz: Optional[str], run_dir: str,
          valid_xyz: Optional[str] = None, log: Optional[str] = None) -> Dict[str, Any]:
    """Train MACE with its own entry point under the MACE venv; resumable.

    Runs ``VENV/bin/python -m mace.cli.run_train`` (arguments from
    :func:`train_argv`) with ``OMP_NUM_THREADS = cfg.threads``, output to
    ``run_dir/train.log``. A rerun with the same config resumes from MACE's
    latest checkpoint (``--restart_latest``; MACE checkpoints when the
    validation loss improves, so up to the epochs since then are redone) and
    adds its wall-clock to the record; a finished run is not started again
    unless ``cfg.epochs`` grew (then it continues to the new count). Any other
    config change for an existing ``run_dir`` is refused (``ValueError``).
    Returns (and writes to ``run_dir/est_train.json``): config, command,
    ``wall_s`` and ``cpu_s`` (all finished calls, including MACE's data
    loading, statistics and final evaluation; CPU seconds are what a busy
    machine does not inflate), ``model`` path, the learning curve and
    per-epoch timing (:func:`learning_curve`, :func:`epoch_timing`). The
    MACE process is stopped when this process is interrupted or dies (the
    killed call's time is then not in ``wall_s``/``cpu_s``; the curve's
    ``opt_seconds`` still has every kept step).
    """
    if not available():
        raise FileNotFoundError(f"{venv_python()} not found; {MISSING}")
    run = Path(run_dir).resolve()
    run.mkdir(parents=True, exist_ok=True)
    record_path = run / TRAIN_RECORD
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    old = record.get("config", {})
    changed = sorted(k for k, v in asdict(cfg).items() if k in old and old[k] != v and k not in _RESUMABLE)
    if changed:
        raise ValueError(f"{run} holds a MACE run with other " + ", ".join(f"{k}={old[k]!r}" for k in changed)
                         + f" (asked: {', '.join(f'{k}={getattr(cfg, k)!r}' for k in changed)}); "
                         "use a new run_dir or delete this one")
    model = run / f"{RUN_NAME}.model"
    if record.get("finished") and model.exists() and old.get("epochs", 0) >= cfg.epochs:
        return record
    files = [str(Path(p).resolve()) if p else None for p in (train_xyz, test_xyz, valid_xyz)]
    resume_after_checkpoint(run)
    argv = [str(venv_python()), "-m", "mace.cli.run_train",
            *train_argv(cfg, train_xyz=files[0], test_xyz=files[1], run_dir=str(run), valid_xyz=files[2])]
    t0, cpu0 = time.perf_counter(), _children_cpu()
    code = _run_child(argv, env=_thread_env(cfg.threads, cfg.keep_freed_memory), log=log or run / "train.log", cwd=run)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    record = {"config": asdict(cfg), "command": argv, "calls": record.get("calls", []) + [round(wall, 3)],
              "wall_s": round(record.get("wall_s", 0.0) + wall, 3),
              "cpu_s": round(record.get("cpu_s", 0.0) + cpu, 3), "model": str(model),
              "n_train_file": _count_frames(files[0]), "mace_version": _venv_mace_version()}
    if code != 0 or not model.exists():
        record_path.write_text(json.dumps(record, indent=1))
        tail = Path(log or run / "train.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"MACE training failed (exit {code}); log tail:\n{tail}")
    record["finished"] = True
    record.update(epoch_timing(run))
    record["curve"] = learning_curve(run)
    _write_atomic(record_path, json.dumps(record, indent=1))
    return record


def resume_after_checkpoint(run_dir: str | os.PathLike) -> Optional[str]:
    """Rename MACE's latest checkpoint ``<tag>_epoch-N.pt`` to ``epoch-(N+1)``, so that ``--restart_latest``
    starts with the epoch after it instead of training epoch N again; returns the new name (None: no checkpoint,
    or this one was renamed already).

    The rename is noted (name, size, modification time; ``RUN_DIR/checkpoints/est_resume.json``, with every
    earlier rename): a run killed again before MACE saves a newer checkpoint restarts from the same renamed file,
    which must not move again (that would skip an epoch). MACE overwriting the file under the same name changes
    its modification time, so it is renamed at the next resume."""
    folder = Path(run_dir) / "checkpoints"
    found = [(int(m["epoch"]), path, m) for path in folder.glob("*.pt") if (m := _CHECKPOINT.match(path.name))]
    if not found:
        return None
    epoch, path, m = max(found, key=lambda f: f[0])
    note_path = folder / RESUME_NOTE
    note = json.loads(note_path.read_text()) if note_path.exists() else {"renamed": []}
    st = path.stat()
    if note["renamed"] and note["renamed"][-1]["to"] == path.name and \
            note["renamed"][-1]["mtime_ns"] == st.st_mtime_ns and note["renamed"][-1]["size"] == st.st_size:
        return None
    new = path.with_name(f"{m['tag']}_epoch-{epoch + 1}{m['swa'] or ''}.pt")
    os.replace(path, new)  # keeps size and modification time
    note["renamed"].append({"from": path.name, "to": new.name, "epoch": epoch + 1, "size": st.st_size,
                            "mtime_ns": st.st_mtime_ns})
    _write_atomic(note_path, json.dumps(note, indent=1))
    return new.name


def _write_atomic(path: str | os.PathLike, text: str) -> None:
    """``text`` into ``path`` through a temporary file beside it: a reader never sees half a file, a failed write
    leaves the old one. (``est.data.cache.atomic_text`` on est's side; this module also runs in the MACE venv, without est.)"""
    tmp = Path(f"{path}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _children_cpu() -> float:
    """User + system CPU seconds of finished child processes (robust to a busy machine)."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the parent dies (Linux), so no orphaned training runs on."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the parent's terminate() on interrupt still applies
        pass


def _venv_mace_version() -> Optional[str]:
    try:
        out = subprocess.run([str(venv_python()), "-c", "from importlib.metadata import version as v; "
                              "print(v('mace-torch'), v('e3nn'), v('torch'))"],
                             capture_output=True, text=True, env=_thread_env(1), timeout=120)
        mace, e3nn, torch = out.stdout.split()
        return f"mace-torch {mace}, e3nn {e3nn}, torch {torch}"
    except Exception:  # noqa: BLE001 - only informative
        return None


def _results_rows(run_dir: str | os.PathLike) -> List[Dict[str, Any]]:
    """MACE's per-step / per-evaluation JSON lines (``results/mace_run-SEED_train.txt``)."""
    files = sorted(Path(run_dir, "results").glob(f"{RUN_NAME}_run-*_train.txt"))
    rows = []
    for f in files:
        for line in f.read_text().splitlines():
            if line.strip():
                rows.append(json.loads(line))
    return rows


def _epochs(run_dir: str | os.PathLike) -> List[Dict[str, Any]]:
    """The epochs the final weights went through, in training order: ``{"epoch", "opt" (seconds of each
    optimiser step), "eval" (the validation row or None)}``, resumes folded in.

    Each MACE start logs one validation row with ``epoch`` None first. A resumed start loads the checkpoint of
    epoch c and begins at epoch e: c = e - 1 when :func:`resume_after_checkpoint` renamed it (noted in
    ``checkpoints/est_resume.json``), else c = e (MACE's own restart, which trains epoch c again). The earlier
    starts' epochs after c are dropped (their work is not in the checkpoint); epochs up to c stay, so an epoch
    trained twice is listed twice.
    """
    note = Path(run_dir) / "checkpoints" / RESUME_NOTE
    renamed = {r["epoch"] for r in json.loads(note.read_text())["renamed"]} if note.exists() else set()
    epochs: List[Dict[str, Any]] = []
    new_start = False
    for r in _results_rows(run_dir):
        mode, e = r.get("mode"), r.get("epoch")
        if e is None:
            new_start = True
            continue
        e = int(e)
        if new_start and mode == "opt":
            checkpoint = e - 1 if e in renamed else e
            epochs = [row for row in epochs if row["epoch"] <= checkpoint]
            epochs.append({"epoch": e, "opt": [], "eval": None})
            new_start = False
        elif mode == "opt" and (not epochs or epochs[-1]["epoch"] != e):
            epochs.append({"epoch": e, "opt": [], "eval": None})
        if mode == "opt":
            epochs[-1]["opt"].append(float(r["time"]))
        elif mode == "eval":  # the latest listing of its epoch
            row = next((row for row in reversed(epochs) if row["epoch"] == e), None)
            if row is not None:
                row["eval"] = r
    return epochs


def epoch_step_times(run_dir: str | os.PathLike) -> List[List[float]]:
    """MACE's wall seconds of each optimiser step, per epoch in training order (resumes folded in as in
    :func:`_epochs`)."""
    return [v["opt"] for v in _epochs(run_dir) if v["opt"]]


def epoch_timing(run_dir: str | os.PathLike) -> Dict[str, Any]:
    """Optimiser seconds per epoch (the sum of MACE's per-step wall ``time``) and steps per epoch."""
    trained = [v["opt"] for v in _epochs(run_dir) if v["opt"]]
    if not trained:
        return {}
    secs = [sum(opt) for opt in trained]
    return {"epochs_run": len(secs), "steps_per_epoch": len(trained[0]),
            "opt_s_per_epoch_median": round(float(np.median(secs)), 3), "opt_s_total": round(float(sum(secs)), 3)}


def learning_curve(run_dir: str | os.PathLike) -> List[Dict[str, float]]:
    """Validation errors after each evaluated epoch vs optimiser steps and optimiser seconds.

    Rows ``{"epoch", "steps", "opt_seconds", "energy_mae_meV_atom", "forces_mae_meV_A"}``
    from MACE's results file; ``opt_seconds`` sums the per-step wall times (no
    start-up or evaluation; of a resumed run the steps the final weights went through, :func:`_epochs`).
    """
    steps, secs, rows = 0, 0.0, []
    for v in _epochs(run_dir):
        e = v["epoch"]
        steps += len(v["opt"])
        secs += sum(v["opt"])
        r = v["eval"]
        if r is not None:
            rows.append({"epoch": e, "steps": steps, "opt_seconds": round(secs, 3),
                         "energy_mae_meV_atom": 1000.0 * float(r["mae_e_per_atom"]),
                         "forces_mae_meV_A": 1000.0 * float(r["mae_f"])})
    return rows


# ----------------------------------------------------------------------------- evaluation (MACE side)
#: force_metrics' per-frame force MAE (meV/A, frames in the order given): paired comparisons frame by frame
FRAMES_KEY = "forces_mae_frames_meV_A"


def force_metrics(e_pred: Sequence[float], e_ref: Sequence[float], natoms: Sequence[int],
                  f_pred: np.ndarray, f_ref: np.ndarray) -> Dict[str, Any]:
    """Energy and force errors with est's definitions (module docstring), and each frame's force MAE
    (``FRAMES_KEY``, a list over the frames: the mean of ``|dF|`` over its atoms and components).

    ``e_*`` [B] eV, ``natoms`` [B], ``f_*`` [N, 3] eV/A (frames concatenated).
    """
    e_pred, e_ref = np.asarray(e_pred, np.float64), np.asarray(e_ref, np.float64)  # [B]
    n = np.asarray(natoms, np.float64)  # [B]
    f_pred, f_ref = np.asarray(f_pred, np.float64), np.asarray(f_ref, np.float64)  # [N, 3]
    if f_pred.shape != f_ref.shape or f_pred.shape[0] != int(n.sum()):
        raise ValueError(f"forces {f_pred.shape} vs {f_ref.shape} for {int(n.sum())} atoms")
    de = np.abs(e_pred - e_ref)  # [B]
    num = (f_pred * f_ref).sum(-1)  # [N]
    den = np.maximum(np.linalg.norm(f_pred, axis=-1) * np.linalg.norm(f_ref, axis=-1), 1e-12)  # [N]
    frame = np.repeat(np.arange(len(n)), n.astype(int))  # [N] frame of each atom
    per_frame = np.bincount(frame, weights=np.abs(f_pred - f_ref).sum(-1), minlength=len(n)) / (3.0 * n)  # [B] eV/A
    return {"frames": int(len(e_ref)), "atoms": int(n.sum()),
            "energy_mae_meV": 1000.0 * float(de.mean()),
            "energy_mae_meV_atom": 1000.0 * float((de / n).mean()),
            "forces_mae_meV_A": 1000.0 * float(np.abs(f_pred - f_ref).mean()),
            "forces_rmse_meV_A": 1000.0 * float(np.sqrt(((f_pred - f_ref) ** 2).mean())),
            "forces_cos": float((num / den).mean()),
            FRAMES_KEY: [round(1000.0 * float(x), 4) for x in per_frame]}


def mace_calculator(model: str, *, dtype: str = "float64"):
    """MACE's ASE calculator for a model file written by :func:`train` (CPU)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from mace.calculators import MACECalculator

        return MACECalculator(model_paths=str(model), device="cpu", default_dtype=dtype)


def read_frames(xyz: str) -> list:
    from ase.io import read

    return read(xyz, index=":", format="extxyz")


def evaluate(model: str, xyz: str, *, dtype: str = "float64") -> Dict[str, Any]:
    """Errors of a trained MACE model on the frames of ``xyz`` (``REF_energy``/``REF_forces``)."""
    frames = read_frames(xyz)
    calc = mace_calculator(model, dtype=dtype)
    e_pred, e_ref, n, fp, fr = [], [], [], [], []
    t0, c0 = time.perf_counter(), time.process_time()
    for a in frames:
        a.calc = calc
        e_pred.append(float(a.get_potential_energy()))
        fp.append(np.array(a.get_forces()))
        e_ref.append(float(a.info[ENERGY_KEY]))
        fr.append(np.asarray(a.arrays[FORCES_KEY]))
        n.append(len(a))
    out = force_metrics(e_pred, e_ref, n, np.concatenate(fp), np.concatenate(fr))
    out["seconds"], out["cpu_s"] = round(time.perf_counter() - t0, 3), round(time.process_time() - c0, 3)
    out["model"], out["xyz"], out["dtype"] = str(model), str(xyz), dtype
    out["params"] = int(sum(p.numel() for m in calc.models for p in m.parameters()))
    return out


# ----------------------------------------------------------------------------- NVE MD (any ASE calculator)
def bonds(atoms, *, scale: float = 1.2) -> tuple[np.ndarray, np.ndarray]:
    """Bonded pairs ``[P, 2]`` (distance < scale x sum of covalent radii) and their lengths ``[P]``."""
    from ase.data import covalent_radii

    pos = atoms.get_positions()  # [n, 3]
    r = covalent_radii[atoms.numbers]  # [n]
    d = np.linalg.norm(pos[:, None] - pos[None], axis=-1)  # [n, n]
    i, j = np.triu_indices(len(atoms), k=1)
    keep = d[i, j] < scale * (r[i] + r[j])
    pairs = np.stack([i[keep], j[keep]], axis=1)  # [P, 2]
    return pairs, d[i, j][keep]


def _load_md_state(path: Optional[str], key: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The saved trajectory state at ``path`` if it belongs to this run (same start, settings and length)."""
    if not path or not Path(path).exists():
        return None
    try:
        state = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        print(f"[md] {path}: unreadable checkpoint ({type(exc).__name__}), starting the trajectory afresh", flush=True)
        return None
    if state.get("key") != key:
        print(f"[md] {path}: checkpoint of another run (settings differ), starting the trajectory afresh", flush=True)
        return None
    return state


def nve_md(atoms, calc, *, steps: int, timestep_fs: float = 0.5, temperature_K: float = 300.0, seed: int = 0,
           reference=None, bond_factor: float = 1.5, every: int = 1, checkpoint: Optional[str] = None,
           checkpoint_every: int = 1000) -> Dict[str, Any]:
    """Velocity Verlet NVE from ``atoms`` with Maxwell-Boltzmann velocities at ``temperature_K``.

    Centre-of-mass momentum is removed. Every ``every`` steps the total energy
    ``E(t)`` and the longest bond stretch ``max_b d_b(t) / d_b(ref)`` are
    recorded (bonds from ``reference``, default the starting geometry).
    ``drift_meV_atom_ps`` is the slope of the least-squares line through
    ``E(t)`` divided by the atom count; ``intact`` is whether the stretch stayed
    below ``bond_factor``. A calculator error (e.g. atoms blown apart) ends the
    run early with ``failed`` set. Works for MACE's calculator and est's alike.

    ``checkpoint``: a JSON file that holds the trajectory state (step, positions,
    momenta, the records so far, seconds spent), written atomically every
    ``checkpoint_every`` steps and removed when the run ends. A killed run
    started again with the same arguments continues from it; velocity Verlet
    recomputes the forces from the saved positions, so on one machine the
    resumed trajectory is the uninterrupted one, bit for bit.
    """
    from ase import units
    from ase.md.velocitydistribution import Stationary
    from ase.md.verlet import VelocityVerlet

    try:
        from ase.md.velocitydistribution import thermalize_momenta as _thermalize
    except ImportError:  # ase < 3.29
        from ase.md.velocitydistribution import MaxwellBoltzmannDistribution

        def _thermalize(a, temperature_K, rng):
            MaxwellBoltzmannDistribution(a, temperature_K=temperature_K, rng=rng)

    a = atoms.copy()
    a.calc = calc
    pairs, d0 = bonds(reference if reference is not None else atoms)
    key = {"numbers": [int(z) for z in a.numbers], "start": a.get_positions().tolist(), "steps": int(steps),
           "timestep_fs": float(timestep_fs), "temperature_K": float(temperature_K), "seed": int(seed),
           "every": int(every)}
    state = _load_md_state(checkpoint, key)
    if state is None:
        _thermalize(a, temperature_K=temperature_K, rng=np.random.RandomState(seed))
        Stationary(a)
        t_ps, etot, stretch, spent = [], [], [], (0.0, 0.0)
    else:
        a.set_positions(np.asarray(state["positions"]))
        a.set_momenta(np.asarray(state["momenta"]))
        t_ps, etot, stretch, spent = state["t_ps"], state["etot"], state["stretch"], tuple(state["spent"])
        print(f"[md] resumed from {checkpoint} at step {state['done']} of {steps}", flush=True)

    def record():
        if len(t_ps) > md.nsteps // every:  # an ASE that calls observers again at the start of a resumed run
            return
        pos = a.get_positions()
        d = np.linalg.norm(pos[pairs[:, 0]] - pos[pairs[:, 1]], axis=-1) if len(pairs) else np.ones(1)
        t_ps.append(len(t_ps) * every * timestep_fs * 1e-3)
        etot.append(float(a.get_potential_energy() + a.get_kinetic_energy()))
        stretch.append(float((d / (d0 if len(pairs) else 1.0)).max()))

    md = VelocityVerlet(a, timestep=timestep_fs * units.fs)
    md.attach(record, interval=every)
    failed = ""
    t0, c0 = time.perf_counter(), time.process_time()

    def elapsed() -> tuple[float, float]:
        return spent[0] + time.perf_counter() - t0, spent[1] + time.process_time() - c0

    def save() -> None:
        _write_atomic(checkpoint, json.dumps({"key": key, "done": int(md.nsteps), "positions": a.get_positions().tolist(),
                                              "momenta": a.get_momenta().tolist(), "t_ps": t_ps, "etot": etot,
                                              "stretch": stretch, "spent": list(elapsed())}))

    if checkpoint:
        Path(checkpoint).parent.mkdir(parents=True, exist_ok=True)
        md.attach(save, interval=max(int(checkpoint_every), 1))
    if state is not None:
        md.nsteps = int(state["done"])  # ASE counts on from here and skips the start-of-run observers
    try:
        md.run(steps - md.nsteps)
    except Exception as exc:  # noqa: BLE001 - any calculator failure ends this trajectory, reported
        failed = f"stopped after {md.nsteps} steps: {type(exc).__name__}: {str(exc)[:120]}"
    seconds, cpu = elapsed()
    if checkpoint and Path(checkpoint).exists():
        Path(checkpoint).unlink()
    e, t = np.asarray(etot), np.asarray(t_ps)
    finite = bool(np.isfinite(e).all())
    slope = float(np.polyfit(t, e, 1)[0]) if len(e) > 2 and finite else float("nan")
    n = len(a)
    return {"natoms": n, "steps": int(md.nsteps), "timestep_fs": timestep_fs, "temperature_K": temperature_K,
            "seed": seed, "drift_meV_atom_ps": 1000.0 * slope / n,
            "max_dev_meV_atom": 1000.0 * float(np.abs(e - e[0]).max()) / n if finite and len(e) else float("nan"),
            "max_bond_stretch": max(stretch) if stretch else float("nan"), "bonds": int(len(pairs)),
            "intact": bool(stretch) and not failed and finite and max(stretch) < bond_factor,
            "T_end_K": float(a.get_temperature()), "seconds": round(seconds, 3),
            "ms_per_step": round(1000.0 * seconds / max(int(md.nsteps), 1), 3),
            "cpu_ms_per_step": round(1000.0 * cpu / max(int(md.nsteps), 1), 3), "failed": failed}


# ----------------------------------------------------------------------------- CLI
def _set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


def _emit(result: Dict[str, Any], path: Optional[str]) -> None:
    text = json.dumps(result, indent=1)
    print(text, flush=True)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(path, text)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    e = sub.add_parser("export", help="est LMDB -> extxyz (est's environment)")
    e.add_argument("--lmdb", required=True)
    e.add_argument("--out", required=True)
    e.add_argument("--limit", type=int, default=None)
    e.add_argument("--start", type=int, default=0, help="first sample exported")

    t = sub.add_parser("train", help="MACE's run_train under the MACE venv (resumable)")
    t.add_argument("--train", required=True)
    t.add_argument("--test", default=None)
    t.add_argument("--valid", default=None, help="validation xyz (default: --valid-fraction of --train)")
    t.add_argument("--run-dir", required=True)
    defaults = MaceTrainConfig()
    for name, value in asdict(defaults).items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            t.add_argument(flag, action=argparse.BooleanOptionalAction, default=value)
        else:
            t.add_argument(flag, type=type(value) if value is not None else float, default=value)

    v = sub.add_parser("evaluate", help="test errors of a trained model (MACE venv)")
    v.add_argument("--model", required=True)
    v.add_argument("--xyz", required=True)
    v.add_argument("--dtype", default="float64")

    m = sub.add_parser("md", help="NVE MD through MACECalculator (MACE venv)")
    m.add_argument("--model", required=True)
    m.add_argument("--xyz", required=True, help="start from a frame of this file")
    m.add_argument("--frame", type=int, default=0)
    m.add_argument("--steps", type=int, default=20000)
    m.add_argument("--timestep-fs", type=float, default=0.5)
    m.add_argument("--temperature", type=float, default=300.0)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--every", type=int, default=1)
    m.add_argument("--dtype", default="float64")
    m.add_argument("--checkpoint", default=None, help="resumable: trajectory state saved here every 1000 steps")

    for s in (e, t, v, m):
        s.add_argument("--json", default=None, help="also write the result here")
        if s is not t:
            s.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)

    if args.command == "export":
        result = export_xyz(args.lmdb, args.out, limit=args.limit, start=args.start)
    elif args.command == "train":
        cfg = MaceTrainConfig(**{k: getattr(args, k) for k in asdict(defaults)})
        result = train(cfg, train_xyz=args.train, test_xyz=args.test, run_dir=args.run_dir, valid_xyz=args.valid)
        result = {k: v for k, v in result.items() if k != "curve"} | {"curve_points": len(result.get("curve", []))}
    elif args.command == "evaluate":
        _set_threads(args.threads)
        result = evaluate(args.model, args.xyz, dtype=args.dtype)
    else:
        _set_threads(args.threads)
        start = read_frames(args.xyz)[args.frame]
        calc = mace_calculator(args.model, dtype=args.dtype)
        result = nve_md(start, calc, steps=args.steps, timestep_fs=args.timestep_fs, temperature_K=args.temperature,
                        seed=args.seed, every=args.every, checkpoint=args.checkpoint)
        result.update(model=args.model, xyz=args.xyz, frame=args.frame)
    _emit(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
