"""GFN2-xTB molecular-dynamics frames of small organic molecules, in the OC20 S2EF LMDB layout.

Per molecule (:mod:`est.data.molecules`: ethanol, malonaldehyde, aspirin,
paracetamol) and split (train, test):

1. the starting geometry is relaxed with GFN2-xTB (ASE ``LBFGS``, fmax
   ``relax_fmax``), once per molecule;
2. Maxwell-Boltzmann momenta at ``temperature_K`` (500 K), then ASE Langevin MD
   (timestep 0.5 fs, friction ``friction_per_fs``, centre of mass free);
   ``equilibration_steps`` steps are discarded;
3. one frame every ``stride`` MD steps is labelled with the GFN2-xTB total
   energy (eV) and forces (eV/A) of ``tblite`` (``tblite.ase.TBLite``) -
   the same single point that drives the MD, so a frame costs ``stride``
   SCF calculations.

Train and test are separate trajectories from the same relaxed geometry with
different random streams (``np.random.SeedSequence([seed, crc32(name), split])``,
split 0 = train, 1 = test): never interleaved frames of one trajectory.

Stride and friction, measured (``python -m est.data.xtb --measure ethanol
--measure-steps 10000``: 1 ps equilibration, then 5 ps at 500 K, 0.5 fs): with
friction 0.05/fs the integrated correlation times are 5.1 steps (2.6 fs) for the
forces, 68.5 steps (34 fs) for the potential energy and ~400 steps (200 fs,
slow torsions) for the standardised interatomic distances; the correlation at
a lag of 20 / 40 / 60 steps is 0.19 / 0.03 / 0.01 for the forces and
0.41 / 0.18 / 0.11 for the energy. (Friction 0.01/fs gave the same force time
but 226 steps for the energy; Langevin samples the same canonical ensemble at
any friction, so the stronger coupling is free decorrelation.) The default
stride of 20 steps (10 fs, 4 force correlation times) makes consecutive frames'
forces nearly independent (0.19), the training signal with 3N labels a frame;
energies stay correlated (tau_int ~ 3.4 frames by this measurement, so about
600 independent energies in 2,000 frames; the built training splits measure
2.3-9.5 frames, 210-860 independent energies, aspirin the most correlated).
Doubling the stride would halve that at twice the cost. The manifest records,
per split, the lag-1 correlation of the written energies and forces and
``N / tau_int`` of the energies, measured on the data.

An SCF that fails (``tblite`` raises, or returns NaN/inf) skips the frame in
flight: the MD goes back to the last written frame (positions, momenta) with a
fresh calculator and draws new noise; skipped frames are counted in the
manifest, and more than ``max_failures`` in a row is an error.

Resumable: each split is written in chunks of ``chunk_frames`` frames, one
``data.NNNN.lmdb`` file per chunk (written under a temporary name and moved in
place, so never a half record), followed by the MD state after that chunk
(positions, momenta, random state) in ``OUT/.state``. Every chunk starts from
such a state with a fresh calculator, whether the run was interrupted or not,
so a resumed run writes the same records as an uninterrupted one, bit for bit
(the LMDB files' bytes may differ in unused page space).

Layout written (``--format lmdb``, the default; ``--format aselmdb`` writes the
same records as fairchem 2.x ASE LMDB files ``data.NNNN.aselmdb`` through the
same writer as ``est.data.generate``, :func:`est.data.formats.open_writer`,
which needs ``ase-db-backends``; an empty split then has no data file, only
``metadata.npz``, as an ASE LMDB set cannot be opened empty)::

    OUT/<molecule>/{train,test}/data.NNNN.lmdb + metadata.npz
        pos, atomic_numbers, natoms, cell (zeros), pbc (all False), fixed (0),
        tags (0), energy (total GFN2-xTB, eV), forces (eV/A), sid, fid
    OUT/<molecule>/relaxed.npz          relaxed geometry: numbers, positions, energy, forces
    OUT/mixed/{train,test}/data.NNNN.lmdb + metadata.npz
        relative symbolic links to the per-molecule chunk files, molecules in
        the manifest's order (one dataset of all molecules; shuffle when training)
    OUT/manifest.json                   written last: the set is complete when it exists; it lists
                                        every finished molecule in OUT, those of earlier calls too
    OUT/.state/                         resume state (config, MD state per chunk)

``sid = 2 * MOLECULES.index(name) + split`` names the trajectory, ``fid`` the
frame in it (0, 1, ...; skipped frames take no number).

CLI::

    python -m est.data.xtb --out DIR --molecules ethanol malonaldehyde aspirin paracetamol \\
        --train-frames 2000 --test-frames 500 [--stride 20] [--seed 0] [--format aselmdb]
    python -m est.data.xtb --measure ethanol [--measure-steps 10000]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import zlib
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .ase_helpers import optimizer, s2ef_record, thermalize
from .cache import atomic_json, atomic_savez
from .formats import SUFFIXES, WRITE_FORMATS, open_dataset, open_writer
from .molecules import MOLECULES, bond_counts, bond_graph, molecule

__all__ = ["XTBConfig", "generate", "relax", "xtb_calculator", "openmp_threads", "SCFError", "autocorrelation",
           "measure_autocorrelation", "main"]

SPLITS = ("train", "test")
#: the autocorrelation measurement behind the default stride (see module docstring)
STRIDE_MEASUREMENT = {
    "command": "python -m est.data.xtb --measure ethanol --measure-steps 10000",
    "molecule": "ethanol", "temperature_K": 500.0, "timestep_fs": 0.5, "friction_per_fs": 0.05, "steps": 10000,
    "tau_int_steps": {"forces": 5.1, "energy": 68.5, "distances": 398.7},
    "rho_at_lag_20_40_60_steps": {"forces": [0.19, 0.027, 0.008], "energy": [0.405, 0.177, 0.112]},
    "friction_0.01_per_fs_tau_int_steps": {"forces": 5.1, "energy": 225.9, "distances": 449.7},
}


@dataclass(kw_only=True)
class XTBConfig:
    """Settings of :func:`generate` (see module docstring); units K, fs, eV, A."""

    molecules: Tuple[str, ...] = MOLECULES
    train_frames: int = 2000
    test_frames: int = 500
    seed: int = 0
    method: str = "GFN2-xTB"
    temperature_K: float = 500.0
    timestep_fs: float = 0.5
    friction_per_fs: float = 0.05
    stride: int = 20
    equilibration_steps: int = 2000
    relax_fmax: float = 0.01
    relax_steps: int = 1000
    chunk_frames: int = 100
    max_failures: int = 10
    threads: int = 1  # OpenMP threads of the SCF (more threads on a busy machine are much slower)
    file_format: str = "lmdb"  # "lmdb" (OC20 layout) or "aselmdb" (fairchem 2.x ASE LMDB)

    def __post_init__(self):
        self.molecules = tuple(self.molecules)
        unknown = [m for m in self.molecules if m not in MOLECULES]
        if unknown:
            raise ValueError(f"unknown molecule(s) {unknown}; known molecules: {', '.join(MOLECULES)}")
        if not self.molecules or len(set(self.molecules)) != len(self.molecules):
            raise ValueError(f"molecules must be a non-empty list without repeats, got {list(self.molecules)}")
        if self.file_format not in WRITE_FORMATS:
            raise ValueError(f"file_format {self.file_format!r} is not one of {WRITE_FORMATS}")
        if self.method not in ("GFN2-xTB", "GFN1-xTB"):
            raise ValueError(f"method {self.method!r} is not one of 'GFN2-xTB', 'GFN1-xTB'")
        for name in ("train_frames", "test_frames", "equilibration_steps", "seed"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("stride", "chunk_frames", "max_failures", "relax_steps", "threads"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("temperature_K", "timestep_fs", "friction_per_fs", "relax_fmax"):
            v = float(getattr(self, name))
            if not (np.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a positive number, got {getattr(self, name)}")

    def frames(self, split: str) -> int:
        return self.train_frames if split == "train" else self.test_frames

    @property
    def suffix(self) -> str:
        """The data files' suffix, ``.lmdb`` or ``.aselmdb``."""
        return SUFFIXES[self.file_format]

    def physics(self) -> Dict[str, object]:
        """The settings a resumed set must share: those that determine the frames, and the file format
        (all but ``molecules``)."""
        d = asdict(self)
        d.pop("molecules")
        return d


# ------------------------------------------------------------------ calculator


class SCFError(RuntimeError):
    """GFN2-xTB gave no usable energy/forces for a frame (SCF failed or non-finite results)."""


def xtb_calculator(method: str = "GFN2-xTB"):
    """A fresh ``tblite.ase.TBLite`` calculator (quiet); a clear ImportError without tblite."""
    try:
        from tblite.ase import TBLite
    except ImportError as exc:
        raise ImportError(f"GFN2-xTB labels need the tblite package ({exc}); install it with "
                          "`pip install tblite` or `pip install -e .[xtb]`") from None
    return TBLite(method=method, verbosity=0)


@contextmanager
def openmp_threads(n: int):
    """Run the block with ``n`` OpenMP threads (restored afterwards).

    tblite's SCF is OpenMP-parallel; when torch is loaded first (``est`` imports
    it) both share one OpenMP runtime, so ``torch.set_num_threads`` sets
    tblite's thread count too.
    """
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _scf_errors() -> tuple:
    from ase.calculators.calculator import CalculatorError

    errors = [CalculatorError, SCFError]
    try:
        from tblite.exceptions import TBLiteRuntimeError, TBLiteValueError
        errors += [TBLiteRuntimeError, TBLiteValueError]
    except ImportError:
        pass
    return tuple(errors)


def _label(atoms) -> Tuple[float, np.ndarray]:
    """(energy, forces) of ``atoms`` from its calculator; :class:`SCFError` if not finite."""
    e = float(atoms.get_potential_energy())
    f = np.array(atoms.get_forces())                                          # [n, 3]
    if not (np.isfinite(e) and np.isfinite(f).all() and np.isfinite(atoms.positions).all()):
        raise SCFError(f"non-finite xTB result (energy {e}, forces finite: {bool(np.isfinite(f).all())})")
    return e, f


def relax(name: str, cfg: XTBConfig):
    """Molecule ``name`` relaxed with the configured xTB method; returns (atoms, optimiser steps)."""
    atoms = molecule(name)
    atoms.calc = xtb_calculator(cfg.method)
    opt = optimizer("lbfgs")(atoms, logfile=None)
    converged = opt.run(fmax=cfg.relax_fmax, steps=cfg.relax_steps)
    if not converged:
        raise RuntimeError(f"{name}: {cfg.method} relaxation did not reach fmax {cfg.relax_fmax} eV/A in "
                           f"{cfg.relax_steps} steps; raise relax_steps")
    return atoms, int(opt.nsteps)


# ------------------------------------------------------------------ MD state and chunks


def _seed_sequence(cfg: XTBConfig, name: str, split: str) -> List[int]:
    return [int(cfg.seed), zlib.crc32(name.encode()), SPLITS.index(split)]


def _sid(name: str, split: str) -> int:
    return 2 * MOLECULES.index(name) + SPLITS.index(split)


def _langevin(atoms, cfg: XTBConfig, rng: np.random.Generator):
    from ase import units
    from ase.md.langevin import Langevin

    return Langevin(atoms, cfg.timestep_fs * units.fs, temperature_K=cfg.temperature_K,
                    friction=cfg.friction_per_fs / units.fs, fixcm=False, rng=rng)


def _atoms_at(relaxed, positions: np.ndarray, momenta: np.ndarray, cfg: XTBConfig):
    atoms = relaxed.copy()
    atoms.positions = positions
    atoms.set_momenta(momenta)
    atoms.calc = xtb_calculator(cfg.method)
    return atoms


def _rng_from(state: Dict[str, object]) -> np.random.Generator:
    rng = np.random.Generator(np.random.PCG64())
    rng.bit_generator.state = json.loads(str(state["rng"]))
    return rng


def _initial_state(relaxed, cfg: XTBConfig, name: str, split: str) -> Dict[str, object]:
    """MD state after thermalisation and ``equilibration_steps`` (no frames yet)."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(_seed_sequence(cfg, name, split))))
    atoms = _atoms_at(relaxed, relaxed.positions.copy(), np.zeros((len(relaxed), 3)), cfg)
    thermalize(atoms, cfg.temperature_K, rng)
    steps = 0
    if cfg.equilibration_steps:
        try:  # a failed SCF here is an error (there is no earlier frame to go back to), not a skipped frame
            _langevin(atoms, cfg, rng).run(cfg.equilibration_steps)
            _label(atoms)
        except _scf_errors() as exc:
            raise SCFError(f"{name}/{split}: {cfg.method} failed during the equilibration ({exc}); "
                           "try another seed or a lower temperature") from exc
        steps = cfg.equilibration_steps
    return {"positions": atoms.positions.copy(), "momenta": atoms.get_momenta(),
            "rng": json.dumps(rng.bit_generator.state), "frames": 0, "skipped": 0, "steps": steps}


def _run_chunk(relaxed, state: Dict[str, object], n: int, cfg: XTBConfig, sid: int):
    """``n`` frames from ``state``: (records, next state). Pure function of its inputs."""
    rng = _rng_from(state)
    good = (np.array(state["positions"]), np.array(state["momenta"]))
    atoms = _atoms_at(relaxed, *good, cfg)
    md = _langevin(atoms, cfg, rng)
    errors = _scf_errors()
    records: List[Dict[str, np.ndarray]] = []
    skipped, steps, in_a_row = int(state["skipped"]), int(state["steps"]), 0
    fid = int(state["frames"])
    while len(records) < n:
        try:
            steps += cfg.stride
            md.run(cfg.stride)
            energy, forces = _label(atoms)
        except errors as exc:
            skipped += 1
            in_a_row += 1
            if in_a_row > cfg.max_failures:
                raise SCFError(f"{cfg.method} failed {in_a_row} times in a row (trajectory sid {sid}, after frame "
                               f"{fid - 1}; last error: {exc}); the MD has left the region xTB can describe") from exc
            atoms = _atoms_at(relaxed, *good, cfg)  # back to the last written frame, fresh calculator
            md = _langevin(atoms, cfg, rng)
            continue
        in_a_row = 0
        rec = s2ef_record(atoms, energy=energy, forces=forces, sid=sid, fid=fid, fixed=np.zeros(len(atoms)))
        records.append(rec)
        fid += 1
        good = (atoms.positions.copy(), atoms.get_momenta())
    nxt = {"positions": good[0], "momenta": good[1], "rng": json.dumps(rng.bit_generator.state),
           "frames": fid, "skipped": skipped, "steps": steps}
    return records, nxt


# ------------------------------------------------------------------ files


def _save_state(path: str, state: Dict[str, object], seconds: float) -> None:
    atomic_savez(path, positions=state["positions"], momenta=state["momenta"], rng=np.array(state["rng"]),
                 counts=np.array([state["frames"], state["skipped"], state["steps"]], dtype=np.int64),
                 seconds=np.array(seconds))


def _load_state(path: str) -> Tuple[Dict[str, object], float]:
    with np.load(path, allow_pickle=False) as z:
        frames, skipped, steps = (int(v) for v in z["counts"])
        state = {"positions": z["positions"], "momenta": z["momenta"], "rng": str(z["rng"]),
                 "frames": frames, "skipped": skipped, "steps": steps}
        return state, float(z["seconds"])


def _chunk_file(folder: str, k: int, suffix: str = ".lmdb") -> str:
    return os.path.join(folder, f"data.{k:04d}{suffix}")


def _chunk_files(folder: str, suffix: str) -> List[str]:
    """Names of the chunk files in ``folder``, in order."""
    return sorted(f for f in os.listdir(folder) if f.startswith("data.") and f.endswith(suffix))


def _split_dataset(folder: str, suffix: str):
    """The dataset of a split folder in either format; None for an empty ``.aselmdb`` split (no file)."""
    return open_dataset(folder) if _chunk_files(folder, suffix) else None


def _clean_partial(folder: str) -> None:
    """Remove temporary files of a run killed mid-write (``.data.NNNN.<suffix>.tmp-PID[-lock]``, ``.tmp-*.npz``)."""
    for f in os.listdir(folder):
        if (f.startswith(".data.") and ".tmp-" in f) or f.startswith(".tmp-"):
            os.remove(os.path.join(folder, f))


def _relaxed(out: str, name: str, cfg: XTBConfig):
    """The relaxed molecule, computed once and stored in ``OUT/<name>/relaxed.npz``; (atoms, info)."""
    from ase import Atoms

    path = os.path.join(out, name, "relaxed.npz")
    if not os.path.isfile(path):
        t0 = time.time()
        atoms, steps = relax(name, cfg)
        e, f = _label(atoms)
        atomic_savez(path, numbers=atoms.numbers, positions=atoms.positions, energy=np.array(e), forces=f,
                     steps=np.array(steps), seconds=np.array(time.time() - t0))
    with np.load(path, allow_pickle=False) as z:
        atoms = Atoms(numbers=z["numbers"], positions=z["positions"])
        info = {"energy_eV": float(z["energy"]), "max_force_eV_per_A": float(np.abs(z["forces"]).max()),
                "relax_steps": int(z["steps"]), "relax_seconds": round(float(z["seconds"]), 2)}
    info["bonds"] = bond_counts(atoms)
    return atoms, info


def _split_summary(folder: str, relaxed, state: Dict[str, object], seconds: float, suffix: str) -> Dict[str, object]:
    """Statistics of a finished split, read back from its files."""
    from ase import Atoms

    ds = _split_dataset(folder, suffix)
    recs = [ds.get_record(i) for i in range(len(ds))] if ds is not None else []
    ref_graph = {tuple(p) for p in bond_graph(relaxed.numbers, relaxed.positions).tolist()}
    ref_counts = bond_counts(relaxed)
    other_graph = other_counts = 0
    for r in recs:
        atoms = Atoms(numbers=r["atomic_numbers"], positions=r["pos"].astype(np.float64))
        other_graph += {tuple(p) for p in bond_graph(atoms.numbers, atoms.positions).tolist()} != ref_graph
        other_counts += bond_counts(atoms) != ref_counts
    e = np.array([float(np.reshape(r["energy"], -1)[0]) for r in recs])      # [N]
    f = np.stack([r["forces"].astype(np.float64).reshape(-1) for r in recs]) if recs else np.zeros((0, 1))
    out = {"frames": len(recs), "skipped_frames": int(state["skipped"]), "md_steps": int(state["steps"]),
           "seconds": round(seconds, 2), "ms_per_md_step": round(1e3 * seconds / max(int(state["steps"]), 1), 2),
           "energy_mean_eV": float(e.mean()) if len(e) else None, "energy_std_eV": float(e.std()) if len(e) else None,
           "force_rms_eV_per_A": float(np.sqrt((f ** 2).mean())) if len(recs) else None,
           # bonded pairs other than the relaxed molecule's (e.g. malonaldehyde's proton transfer), and
           # bond counts per element pair other than its (a different molecule: a bond broken or formed)
           "frames_with_other_bonded_pairs": int(other_graph), "frames_with_other_bond_counts": int(other_counts)}
    if len(recs) > 2:
        out["lag1_correlation"] = {"energy": round(float(autocorrelation(e[:, None])[1]), 4),
                                   "forces": round(float(autocorrelation(f)[1]), 4)}
        out["energy_tau_int_frames"] = round(_tau_int(autocorrelation(e[:, None])), 2)
        out["effective_independent_energies"] = round(len(e) / out["energy_tau_int_frames"], 1)
    return out


def _write_metadata(folder: str, suffix: str) -> None:
    ds = _split_dataset(folder, suffix)
    natoms = ds.natoms if ds is not None else []
    atomic_savez(os.path.join(folder, "metadata.npz"), natoms=np.asarray(natoms, dtype=np.int64))


def _state_dir(out: str, name: str, split: str) -> str:
    """``OUT/.state/<molecule>/<split>``: the split's MD state per chunk, and ``done.json`` once it is finished."""
    return os.path.join(out, ".state", name, split)


def _done_file(out: str, name: str, split: str) -> str:
    """The marker of a finished split (its summary), in :func:`_state_dir`."""
    return os.path.join(_state_dir(out, name, split), "done.json")


def _generate_split(out: str, name: str, split: str, relaxed, cfg: XTBConfig, log) -> Dict[str, object]:
    """Write (or finish) one molecule's split; returns its summary (also kept in ``.state``)."""
    folder = os.path.join(out, name, split)
    sdir = _state_dir(out, name, split)
    done = _done_file(out, name, split)
    if os.path.isfile(done):
        with open(done) as fh:
            return json.load(fh)
    os.makedirs(folder, exist_ok=True)
    os.makedirs(sdir, exist_ok=True)
    _clean_partial(folder)
    total = cfg.frames(split)
    n_chunks = -(-total // cfg.chunk_frames)
    states = sorted(f for f in os.listdir(sdir) if f.startswith("state.") and f.endswith(".npz"))
    t0 = time.time()
    if states:
        k = int(states[-1].split(".")[1])
        state, seconds = _load_state(os.path.join(sdir, states[-1]))
        missing = [c for c in range(k) if not os.path.isfile(_chunk_file(folder, c, cfg.suffix))]
        if missing:
            raise RuntimeError(f"{folder}: chunk files {missing} are missing although {states[-1]} says they were "
                               "written; the set was changed by hand. Fix: rerun with --overwrite")
        log(f"{name}/{split}: resuming after chunk {k} ({state['frames']}/{total} frames)")
    else:
        k = 0
        state = _initial_state(relaxed, cfg, name, split) if total else \
            {"positions": relaxed.positions, "momenta": np.zeros((len(relaxed), 3)), "rng": "{}",
             "frames": 0, "skipped": 0, "steps": 0}  # an empty split runs no MD
        seconds = time.time() - t0
        _save_state(os.path.join(sdir, "state.0000.npz"), state, seconds)
    for stale in _chunk_files(folder, cfg.suffix):
        if int(stale.split(".")[1]) >= k:  # written, but its state was not: redo it
            os.remove(os.path.join(folder, stale))
    sid = _sid(name, split)
    while k < n_chunks:
        t1 = time.time()
        n = min(cfg.chunk_frames, total - k * cfg.chunk_frames)
        records, state = _run_chunk(relaxed, state, n, cfg, sid)
        with open_writer(_chunk_file(folder, k, cfg.suffix), cfg.file_format) as w:
            for rec in records:
                w.add(rec)
        k += 1
        seconds += time.time() - t1
        _save_state(os.path.join(sdir, f"state.{k:04d}.npz"), state, seconds)
        old = os.path.join(sdir, f"state.{k - 1:04d}.npz")
        if os.path.exists(old):
            os.remove(old)
        log(f"{name}/{split}: {state['frames']}/{total} frames, {state['skipped']} skipped, "
            f"{1e3 * seconds / max(int(state['steps']), 1):.1f} ms per MD step")
    if n_chunks == 0 and cfg.file_format == "lmdb":
        with open_writer(_chunk_file(folder, 0), "lmdb"):
            pass  # an empty split is still a readable dataset
    _write_metadata(folder, cfg.suffix)
    summary = _split_summary(folder, relaxed, state, seconds, cfg.suffix)
    summary.update(sid=sid, seed_sequence=_seed_sequence(cfg, name, split))
    atomic_json(done, summary)
    return summary


def _build_mixed(out: str, molecules: Sequence[str], suffix: str) -> Dict[str, int]:
    """``OUT/mixed/<split>``: relative links to every molecule's chunk files, rebuilt from scratch."""
    counts = {}
    mixed = os.path.join(out, "mixed")
    tmp = f"{mixed}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    for split in SPLITS:
        folder = os.path.join(tmp, split)
        os.makedirs(folder)
        k = 0
        for name in molecules:
            src = os.path.join(out, name, split)
            for f in _chunk_files(src, suffix):
                os.symlink(os.path.join("..", "..", name, split, f), _chunk_file(folder, k, suffix))
                k += 1
        _write_metadata(folder, suffix)
        ds = _split_dataset(folder, suffix)
        counts[split] = len(ds) if ds is not None else 0
    shutil.rmtree(mixed, ignore_errors=True)
    os.replace(tmp, mixed)
    return counts


def _versions() -> Dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    import est

    out = {"est": est.__version__, "python": sys.version.split()[0]}
    for pkg in ("tblite", "ase", "numpy", "lmdb"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def _check_config(out: str, cfg: XTBConfig) -> None:
    """Refuse to resume ``out`` with settings other than those it was started with."""
    path = os.path.join(out, ".state", "config.json")
    if os.path.isfile(path):
        with open(path) as fh:
            old = json.load(fh)
        old.setdefault("file_format", "lmdb")  # sets started before the option existed
        new = json.loads(json.dumps(cfg.physics()))
        diff = {k: (old.get(k), v) for k, v in new.items() if old.get(k) != v}
        if diff:
            raise ValueError(f"{out} was started with other settings ({', '.join(f'{k}: {a} -> {b}' for k, (a, b) in diff.items())}); "
                             "resume with the same settings, use another --out, or pass --overwrite")
    else:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_json(path, cfg.physics())


def _set_molecules(out: str, cfg: XTBConfig) -> List[str]:
    """The molecules the manifest of ``out`` lists after this call: those of its previous manifest (in their order),
    then ``cfg.molecules``, then any other molecule whose splits a killed call finished (``MOLECULES`` order).

    A set grows one call at a time (``--molecules ethanol``, later ``--molecules aspirin``): the manifest and
    ``mixed`` describe every finished molecule in the folder, not only the last call's.
    """
    previous = []
    path = os.path.join(out, "manifest.json")
    if os.path.isfile(path):
        with open(path) as fh:
            previous = list(json.load(fh).get("config", {}).get("molecules", []))
    finished = [m for m in MOLECULES
                if all(os.path.isfile(_done_file(out, m, s)) for s in SPLITS)]
    names = [m for m in previous if m in finished]
    for m in (*cfg.molecules, *finished):
        if m not in names:
            names.append(m)
    return names


def generate(out: str, config: Optional[XTBConfig] = None, *, overwrite: bool = False, verbose: bool = True,
             **overrides) -> Dict[str, object]:
    """Generate (or resume) the set in ``out`` (see module docstring); returns the manifest.

    ``overrides`` set :class:`XTBConfig` fields (e.g. ``train_frames=4``).
    Rerunning with the same settings resumes where a killed run stopped;
    other settings are refused unless ``overwrite=True`` (which starts over).
    A call for other molecules adds them: the manifest keeps the molecules of
    earlier calls (:func:`_set_molecules`).
    """
    cfg = config if config is not None else XTBConfig()
    if overrides:
        cfg = XTBConfig(**{**asdict(cfg), **overrides})
    xtb_calculator(cfg.method)  # fail early without tblite
    out = os.path.abspath(out)
    if overwrite and os.path.exists(out):
        shutil.rmtree(out)
    if os.path.exists(out) and not os.path.isdir(os.path.join(out, ".state")):
        raise FileExistsError(f"{out} exists and is not a (partial) xTB set; choose another --out or pass --overwrite")
    manifest_path = os.path.join(out, "manifest.json")
    _check_config(out, cfg)

    def log(msg: str) -> None:
        if verbose:
            print(f"[est.data.xtb] {msg}", file=sys.stderr, flush=True)

    t0 = time.time()
    names = _set_molecules(out, cfg)
    kept = [m for m in names if m not in cfg.molecules]
    if kept:
        log(f"{out} already holds {', '.join(kept)}; the manifest lists {', '.join(names)}")
    cfg = replace(cfg, molecules=tuple(names))
    molecules = {}
    with openmp_threads(cfg.threads):
        for name in cfg.molecules:
            relaxed, info = _relaxed(out, name, cfg)
            splits = {split: _generate_split(out, name, split, relaxed, cfg, log) for split in SPLITS}
            molecules[name] = {"formula": relaxed.get_chemical_formula(), "natoms": len(relaxed), "relaxed": info,
                               "mean_energy_eV": splits["train"]["energy_mean_eV"], "splits": splits}
    mixed = _build_mixed(out, cfg.molecules, cfg.suffix)
    seconds = sum(m["relaxed"]["relax_seconds"] + sum(s["seconds"] for s in m["splits"].values())
                  for m in molecules.values())
    manifest = {
        "format": "est OC20-layout S2EF set: GFN2-xTB molecular dynamics",
        "file_format": cfg.file_format,
        "method": cfg.method,
        "calculator": "tblite.ase.TBLite(method=..., verbosity=0), tblite defaults otherwise "
                      "(accuracy 1, electronic temperature 300 K, Broyden mixer)",
        "config": asdict(cfg),
        "units": {"energy": "eV (total xTB energy, unreferenced)", "forces": "eV/A", "pos": "A"},
        "md": "ASE Langevin, centre of mass free; momenta from Maxwell-Boltzmann at temperature_K; "
              "equilibration_steps discarded; a frame every stride steps",
        "splits": "train and test are separate trajectories: np.random.SeedSequence([seed, crc32(molecule), split])",
        "mixed": "mixed/<split>: relative symlinks to every molecule's chunk files, in config.molecules order",
        "stride_measurement": STRIDE_MEASUREMENT,
        "molecules": molecules,
        "counts": {**{f"{m}/{s}": molecules[m]["splits"][s]["frames"] for m in molecules for s in SPLITS},
                   **{f"mixed/{s}": n for s, n in mixed.items()}},
        "skipped_frames": sum(s["skipped_frames"] for m in molecules.values() for s in m["splits"].values()),
        "seconds": {"generation_total": round(seconds, 1), "this_call": round(time.time() - t0, 1)},
        "versions": _versions(),
    }
    atomic_json(manifest_path, manifest)
    log(f"wrote {manifest['counts']} to {out} ({seconds:.0f} s of generation in all)")
    return manifest


# ------------------------------------------------------------------ stride measurement


def autocorrelation(x: np.ndarray) -> np.ndarray:
    """Normalised autocorrelation ``rho[k]`` of series ``x [T, m]`` (variance-weighted over the m columns).

    ``rho[k] = sum_c sum_t dx[t, c] dx[t + k, c] / (T - k) / sum_c var_c`` with ``dx = x - mean_t x``.
    """
    x = np.asarray(x, dtype=np.float64)
    x = x - x.mean(0)                                                         # [T, m]
    t = len(x)
    n = 1 << (2 * t - 1).bit_length()
    spec = np.fft.rfft(x, n=n, axis=0)
    c = np.fft.irfft(spec * np.conj(spec), n=n, axis=0)[:t].sum(1) / (t - np.arange(t))  # [T]
    return c / c[0] if c[0] > 0 else np.ones(t)


def _tau_int(rho: np.ndarray, window: float = 5.0) -> float:
    """Integrated correlation time ``1 + 2 sum_{k>=1} rho[k]``, summed up to the first k >= window * tau (Sokal)."""
    tau = 1.0
    for k in range(1, len(rho)):
        tau += 2.0 * rho[k]
        if k >= window * tau:
            break
    return max(tau, 1.0)


def measure_autocorrelation(name: str, cfg: Optional[XTBConfig] = None, *, steps: int = 10000,
                            verbose: bool = True) -> Dict[str, object]:
    """Integrated correlation times (MD steps) of energy, forces and distances on one trajectory of ``name``.

    Runs ``cfg.equilibration_steps`` then ``steps`` MD steps from the relaxed
    molecule (train seeds) and evaluates :func:`autocorrelation` of the
    potential energy, the forces (all components) and the interatomic
    distances (each standardised, so every pair counts the same).
    """
    cfg = cfg if cfg is not None else XTBConfig()
    xtb_calculator(cfg.method)  # tblite loaded before its threads are set
    with openmp_threads(cfg.threads):
        relaxed, _ = relax(name, cfg)
        state = _initial_state(relaxed, cfg, name, "train")
        atoms = _atoms_at(relaxed, state["positions"], state["momenta"], cfg)
        md = _langevin(atoms, cfg, _rng_from(state))
        iu = np.triu_indices(len(atoms), 1)
        e, f, d = [], [], []
        t0 = time.time()
        for _ in range(steps):
            md.run(1)
            energy, forces = _label(atoms)
            e.append(energy)
            f.append(forces.reshape(-1))
            d.append(atoms.get_all_distances()[iu])
        seconds = time.time() - t0
    d = np.array(d)
    series = {"energy": np.array(e)[:, None], "forces": np.array(f), "distances": (d - d.mean(0)) / d.std(0)}
    res = {"molecule": name, "steps": steps, "ms_per_md_step": round(1e3 * seconds / steps, 2),
           **{k: getattr(cfg, k) for k in ("temperature_K", "timestep_fs", "friction_per_fs")}, "tau_int_steps": {},
           "rho_at_stride": {}, "stride": cfg.stride}
    res["max_abs_rho_beyond_stride"] = {}
    for key, x in series.items():
        rho = autocorrelation(x)
        res["tau_int_steps"][key] = round(_tau_int(rho), 1)
        res["rho_at_stride"][key] = [round(float(rho[k * cfg.stride]), 3) for k in (1, 2, 3)]
        res["max_abs_rho_beyond_stride"][key] = round(float(np.abs(rho[cfg.stride:steps // 10]).max()), 3)
    if verbose:
        print(json.dumps(res, indent=1))
    return res


# ------------------------------------------------------------------ CLI


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m est.data.xtb", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="output folder (created, or resumed if it holds a partial set)")
    p.add_argument("--molecules", nargs="+", default=list(MOLECULES), help=f"from: {' '.join(MOLECULES)}")
    p.add_argument("--train-frames", type=int, default=2000)
    p.add_argument("--test-frames", type=int, default=500)
    p.add_argument("--stride", type=int, default=XTBConfig.stride, help="MD steps between frames")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=XTBConfig.temperature_K, help="K")
    p.add_argument("--timestep", type=float, default=XTBConfig.timestep_fs, help="fs")
    p.add_argument("--friction", type=float, default=XTBConfig.friction_per_fs, help="1/fs")
    p.add_argument("--equilibration-steps", type=int, default=XTBConfig.equilibration_steps)
    p.add_argument("--chunk-frames", type=int, default=XTBConfig.chunk_frames, help="frames per file (resume unit)")
    p.add_argument("--method", default=XTBConfig.method, choices=("GFN2-xTB", "GFN1-xTB"))
    p.add_argument("--threads", type=int, default=XTBConfig.threads, help="OpenMP threads of the SCF")
    p.add_argument("--format", choices=WRITE_FORMATS, default="lmdb",
                   help="lmdb: OC20-layout LMDB (default); aselmdb: fairchem 2.x ASE LMDB (needs ase-db-backends)")
    p.add_argument("--overwrite", action="store_true", help="delete OUT and start over")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--measure", metavar="MOLECULE", help="measure correlation times on one trajectory instead")
    p.add_argument("--measure-steps", type=int, default=10000)
    a = p.parse_args(argv)
    try:
        cfg = XTBConfig(molecules=tuple(a.molecules) if a.measure is None else (a.measure,),
                        train_frames=a.train_frames, test_frames=a.test_frames, seed=a.seed, method=a.method,
                        temperature_K=a.temperature, timestep_fs=a.timestep, friction_per_fs=a.friction,
                        stride=a.stride, equilibration_steps=a.equilibration_steps, chunk_frames=a.chunk_frames,
                        threads=a.threads, file_format=a.format)
    except ValueError as exc:
        p.error(str(exc))
    if a.measure is not None:
        if a.measure_steps <= cfg.stride:
            p.error(f"--measure-steps must exceed --stride ({cfg.stride}), got {a.measure_steps}")
        measure_autocorrelation(a.measure, cfg, steps=a.measure_steps)
        return 0
    if not a.out:
        p.error("--out is required (or --measure MOLECULE)")
    generate(a.out, cfg, overwrite=a.overwrite, verbose=not a.quiet)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
