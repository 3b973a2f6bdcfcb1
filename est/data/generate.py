"""An OC20-layout dataset made with real (if simple) physics: ASE's EMT.

Systems: fcc(111), fcc(100) and fcc(211) slabs of Cu, Ag, Au, Ni, Pd, Pt, Al
(a few sizes, 3-4 layers, periodic in x and y, vacuum in z) with one adsorbate
(H, C, N, O, OH, CO, CH, CH2, CH3, NH, NH2, NH3, H2O, NO, N2, HCO, CH3O, H2CO, H2)
at a random position and orientation above the surface. As in OC20:
tags 0 = sub-surface (fixed, ``fixed = 1``), 1 = surface (the top two
layers, free), 2 = adsorbate (free).

Per system (all randomness from ``np.random.default_rng([seed, system])``, so
a set is the same for any number of workers):

1. initial structure: placement + a 0.05 A rattle of the free atoms;
2. relaxation with a BFGS-family optimiser (ASE ``LBFGS`` by default,
   ``BFGS`` optional), fmax 0.05 eV/A, at most ``relax_steps`` steps: an IS2RE
   pair (initial -> relaxed) and up to ``relax_frames`` S2EF frames spread
   over the trajectory;
3. Langevin MD from the relaxed structure at a random 300-900 K:
   ``md_frames`` S2EF frames, one every ``md_stride`` steps of 1 fs.

Energies are referenced per frame like OC20 adsorption energies:
``E_ref = E_EMT(frame) - E_EMT(relaxed clean slab, same metal/facet/size) -
sum_adsorbate-atoms mu_X`` with gas-phase references from EMT-relaxed
molecules: ``mu_H = E(H2)/2``, ``mu_O = E(H2O) - E(H2)``,
``mu_C = E(CO) - mu_O``, ``mu_N = E(N2)/2``. Forces are EMT forces (eV/A).

Layout written (``--format lmdb``, the default: :class:`est.data.LmdbWriter`, code-free records)::

    OUT/s2ef/train/data.NNNN.lmdb + metadata.npz    fields: pos, atomic_numbers, natoms,
    OUT/s2ef/val/...                                  cell, pbc, fixed, tags, energy, forces, sid, fid
    OUT/is2re/train/data.lmdb                        pos, pos_relaxed, y_init, y_relaxed, ...
    OUT/is2re/val/data.lmdb
    OUT/manifest.json                                config, counts, references, timing

``--format aselmdb`` writes the same records as fairchem 2.x ASE LMDB databases
(:class:`est.data.AseLmdbWriter`, needs ``ase-db-backends``): ``OUT/s2ef/{train,val}/data.NNNN.aselmdb``
(energy and forces as calculator results, FixAtoms, tags, ``sid``/``fid`` key-value pairs) and
``OUT/is2re/{train,val}/data.aselmdb`` (``pos_relaxed``, ``y_init``, ``y_relaxed`` in the rows' data).

Systems are assigned to val when ``system % k == 1`` with
``k = round(1 / val_fraction)`` (whole systems, so no frame leaks).

CLI::

    python -m est.data.generate --out DIR --frames 3000 [--seed 0] [--workers 2] [--format aselmdb]
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .ase_helpers import optimizer as _optimizer, s2ef_record, thermalize
from .formats import SUFFIXES, WRITE_FORMATS, open_writer

__all__ = ["EMTConfig", "generate", "generate_system", "gas_references", "default_emt_dataset", "main"]

METALS = ("Cu", "Ag", "Au", "Ni", "Pd", "Pt", "Al")
FACETS = ("111", "100", "211")
ADSORBATES = (
    "H", "C", "N", "O", "OH", "CO", "CH", "CH2_s1A1d", "CH3", "NH", "NH2", "NH3", "H2O",
    "NO", "N2", "HCO", "CH3O", "H2CO", "H2",
)
_DEFAULT_SIZES = {"111": ((2, 2, 3), (3, 3, 3), (2, 2, 4), (3, 3, 4)),
                  "100": ((2, 2, 3), (3, 3, 3), (2, 2, 4), (3, 3, 4)),
                  "211": ((3, 2, 3), (3, 3, 3), (3, 2, 4))}


@dataclass(kw_only=True)
class EMTConfig:
    """Settings of :func:`generate` (see module docstring)."""

    frames: int = 3000  # S2EF frames in total (train + val)
    seed: int = 0
    metals: Tuple[str, ...] = METALS
    facets: Tuple[str, ...] = FACETS
    adsorbates: Tuple[str, ...] = ADSORBATES
    vacuum: float = 7.0
    md_frames: int = 12
    md_stride: int = 4
    md_timestep_fs: float = 1.0
    md_temperature_K: Tuple[float, float] = (300.0, 900.0)
    md_friction_per_fs: float = 0.01
    relax_frames: int = 8
    relax_steps: int = 60
    relax_fmax: float = 0.05
    optimizer: str = "lbfgs"  # or "bfgs"
    rattle: float = 0.05
    val_fraction: float = 0.1
    samples_per_shard: int = 5000

    def frames_per_system(self) -> int:
        return self.md_frames + self.relax_frames


# ------------------------------------------------------------------ physics helpers

_GAS_CACHE: Dict[str, float] = {}
_SLAB_CACHE: Dict[Tuple[str, str, Tuple[int, int, int], float], float] = {}


def _relaxed_energy(atoms, fmax: float = 0.01, steps: int = 200, optimizer: str = "lbfgs") -> float:
    from ase.calculators.emt import EMT

    atoms.calc = EMT()
    _optimizer(optimizer)(atoms, logfile=None).run(fmax=fmax, steps=steps)
    return float(atoms.get_potential_energy())


def gas_references() -> Dict[str, float]:
    """Per-element chemical potentials (eV) from EMT-relaxed H2, H2O, CO, N2 (see module docstring)."""
    if not _GAS_CACHE:
        from ase.build import molecule

        e = {}
        for name in ("H2", "H2O", "CO", "N2"):
            mol = molecule(name)
            mol.center(vacuum=6.0)
            e[name] = _relaxed_energy(mol, fmax=0.001, steps=500)
        mu_h = e["H2"] / 2
        mu_o = e["H2O"] - e["H2"]
        _GAS_CACHE.update({"H": mu_h, "O": mu_o, "C": e["CO"] - mu_o, "N": e["N2"] / 2})
        _GAS_CACHE.update({f"E_{k}": v for k, v in e.items()})
    return dict(_GAS_CACHE)


def _build_slab(metal: str, facet: str, size: Tuple[int, int, int], vacuum: float):
    from ase.build import fcc100, fcc111, fcc211

    builder = {"111": fcc111, "100": fcc100, "211": fcc211}[facet]
    slab = builder(metal, size=size, vacuum=vacuum)
    z = slab.positions[:, 2]
    # layers by height (ASE's tags are 0 for fcc211): top two layers are the surface
    levels = np.unique(np.round(z, 1))
    if facet == "211":
        span = z.max() - z.min()
        surface = z >= z.max() - 0.45 * span
    else:
        surface = z >= levels[-2] - 0.05 if len(levels) >= 2 else np.ones(len(slab), bool)
    tags = np.where(surface, 1, 0)
    slab.set_tags(tags)
    return slab


def _fix(atoms) -> None:
    from ase.constraints import FixAtoms

    atoms.set_constraint(FixAtoms(mask=atoms.get_tags() == 0))


def clean_slab_energy(metal: str, facet: str, size: Tuple[int, int, int], vacuum: float, optimizer: str = "lbfgs") -> float:
    """EMT energy of the relaxed clean slab (sub-surface layers fixed), cached."""
    key = (metal, facet, tuple(size), float(vacuum))
    if key not in _SLAB_CACHE:
        slab = _build_slab(metal, facet, size, vacuum)
        _fix(slab)
        _SLAB_CACHE[key] = _relaxed_energy(slab, fmax=0.02, steps=200, optimizer=optimizer)
    return _SLAB_CACHE[key]


def _random_rotation(rng: np.random.Generator) -> np.ndarray:
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    if np.linalg.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


def _adsorbate(name: str):
    from ase import Atoms
    from ase.build import molecule

    if name in ("H", "C", "N", "O"):
        return Atoms(name, positions=[[0.0, 0.0, 0.0]])
    return molecule(name)


def generate_system(cfg: EMTConfig, system: int) -> Dict[str, object]:
    """One system: ``{"s2ef": [frames], "is2re": record, "info": {...}}`` (deterministic)."""
    from ase import units
    from ase.calculators.emt import EMT
    from ase.md.langevin import Langevin

    rng = np.random.default_rng([cfg.seed, system])
    metal = cfg.metals[rng.integers(len(cfg.metals))]
    facet = cfg.facets[rng.integers(len(cfg.facets))]
    sizes = _DEFAULT_SIZES[facet]
    size = sizes[rng.integers(len(sizes))]
    ads_name = cfg.adsorbates[rng.integers(len(cfg.adsorbates))]

    slab = _build_slab(metal, facet, size, cfg.vacuum)
    ads = _adsorbate(ads_name)
    ads.positions = (ads.positions - ads.get_center_of_mass()) @ _random_rotation(rng).T
    top = slab.positions[:, 2].max()
    xy = rng.random(2) @ slab.cell.array[:2, :2]
    height = rng.uniform(1.3, 2.0)
    ads.positions += np.array([xy[0], xy[1], top + height - ads.positions[:, 2].min()])
    ads.set_tags(np.full(len(ads), 2))
    atoms = slab + ads
    _fix(atoms)
    free = atoms.get_tags() > 0
    noise = rng.normal(scale=cfg.rattle, size=(len(atoms), 3))
    atoms.positions[free] += noise[free]
    atoms.calc = EMT()

    gas = gas_references()
    e_slab = clean_slab_energy(metal, facet, size, cfg.vacuum, cfg.optimizer)
    e_gas = float(sum(gas[s] for s in ads.get_chemical_symbols()))
    offset = e_slab + e_gas

    frames: List[Dict[str, np.ndarray]] = []
    init_pos = atoms.positions.copy()
    e_init = float(atoms.get_potential_energy())
    traj: List[Tuple[np.ndarray, float, np.ndarray]] = []
    opt = _optimizer(cfg.optimizer)(atoms, logfile=None)
    for _ in opt.irun(fmax=cfg.relax_fmax, steps=cfg.relax_steps):
        if traj and np.array_equal(traj[-1][0], atoms.positions):
            continue
        traj.append((atoms.positions.copy(), float(atoms.get_potential_energy()),
                     atoms.get_forces(apply_constraint=False).copy()))
    e_relaxed = float(atoms.get_potential_energy())
    picks = np.unique(np.linspace(0, len(traj) - 1, num=min(cfg.relax_frames, len(traj))).round().astype(int))
    probe = atoms.copy()
    for p in picks:
        pos, e, f = traj[p]
        probe.positions = pos
        frames.append(s2ef_record(probe, energy=e - offset, forces=f, sid=system, fid=len(frames)))
    relaxed_pos = atoms.positions.copy()

    if cfg.md_frames > 0:
        temperature = rng.uniform(*cfg.md_temperature_K)
        md_rng = np.random.RandomState(rng.integers(2**31))
        thermalize(atoms, temperature, md_rng)
        md = Langevin(atoms, cfg.md_timestep_fs * units.fs, temperature_K=temperature,
                      friction=cfg.md_friction_per_fs / units.fs, fixcm=False, rng=md_rng)
        for _ in range(cfg.md_frames):
            md.run(cfg.md_stride)
            e = float(atoms.get_potential_energy())
            f = atoms.get_forces(apply_constraint=False)
            if not np.isfinite(e) or np.abs(f).max() > 100.0:
                break  # an unstable trajectory: keep what we have
            frames.append(s2ef_record(atoms, energy=e - offset, forces=f, sid=system, fid=len(frames)))

    probe.positions = init_pos
    is2re = {
        "pos": init_pos.astype(np.float32),
        "pos_relaxed": relaxed_pos.astype(np.float32),
        "atomic_numbers": probe.numbers.astype(np.int64),
        "natoms": np.array([len(probe)], dtype=np.int64),
        "cell": probe.cell.array.astype(np.float32).reshape(1, 3, 3),
        "pbc": np.asarray(probe.pbc, dtype=bool).reshape(1, 3),
        "fixed": (probe.get_tags() == 0).astype(np.int64),
        "tags": probe.get_tags().astype(np.int64),
        "y_init": np.array([e_init - offset], dtype=np.float32),
        "y_relaxed": np.array([e_relaxed - offset], dtype=np.float32),
        "sid": np.array([system], dtype=np.int64),
        "fid": np.array([0], dtype=np.int64),
    }
    info = {"system": system, "metal": metal, "facet": facet, "size": list(size), "adsorbate": ads_name,
            "natoms": len(atoms), "relax_steps": len(traj) - 1, "frames": len(frames)}
    return {"s2ef": frames, "is2re": is2re, "info": info}


# ------------------------------------------------------------------ driver


def _worker(args):
    cfg, system = args
    return generate_system(cfg, system)


def _is_val(system: int, val_fraction: float) -> bool:
    if val_fraction <= 0:
        return False
    k = max(2, int(round(1.0 / val_fraction)))
    return system % k == 1


FORMATS = WRITE_FORMATS


def _writers(tmp: str, fmt: str, samples_per_shard: int) -> Dict[Tuple[str, str], object]:
    """One writer per (task, split) in file format ``fmt`` (see module docstring)."""
    is2re_file = "data" + SUFFIXES[fmt]
    return {("s2ef", s): open_writer(os.path.join(tmp, "s2ef", s), fmt, samples_per_shard=samples_per_shard)
            for s in ("train", "val")} | \
           {("is2re", s): open_writer(os.path.join(tmp, "is2re", s, is2re_file), fmt) for s in ("train", "val")}


def generate(out: str, config: Optional[EMTConfig] = None, *, workers: int = 1, overwrite: bool = False,
             verbose: bool = True, file_format: str = "lmdb", **overrides) -> Dict[str, object]:
    """Generate the dataset into ``out`` (see module docstring); returns the manifest.

    ``overrides`` set :class:`EMTConfig` fields (e.g. ``frames=200, seed=1``); ``file_format`` is
    the file format, ``"lmdb"`` (OC20 layout) or ``"aselmdb"`` (fairchem 2.x ASE LMDB).
    The folder is built under a temporary name and moved into place at the end.
    """
    if file_format not in FORMATS:
        raise ValueError(f"file_format={file_format!r}: choose one of {FORMATS}")
    cfg = config if config is not None else EMTConfig()
    if overrides:
        cfg = EMTConfig(**{**asdict(cfg), **overrides})
    for m in cfg.metals:
        if m not in METALS:
            raise ValueError(f"metal {m!r} is not one EMT supports here; choose from {METALS}")
    for a in cfg.adsorbates:
        try:
            _adsorbate(a)
        except KeyError:
            raise ValueError(f"adsorbate {a!r} is neither H/C/N/O nor an ase.build.molecule name") from None
        if set(_adsorbate(a).get_chemical_symbols()) - {"H", "C", "N", "O"}:
            raise ValueError(f"adsorbate {a!r} has elements other than H, C, N, O")
    for fct in cfg.facets:
        if fct not in FACETS:
            raise ValueError(f"facet {fct!r} not in {FACETS}")
    out = os.path.abspath(out)
    if os.path.exists(out):
        if not overwrite:
            raise FileExistsError(f"{out} already exists; pass overwrite=True (--overwrite) to replace it")
    tmp = out + f".tmp-{os.getpid()}"
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    os.makedirs(tmp)
    t0 = time.time()
    writers = _writers(tmp, file_format, cfg.samples_per_shard)
    gas_references()  # computed once here (and once per worker)
    pool = None
    if workers > 1:
        ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        pool = ctx.Pool(workers)
    frames_written = 0
    systems: List[Dict[str, object]] = []
    next_system = 0
    try:
        while frames_written < cfg.frames:
            remaining = cfg.frames - frames_written
            batch = max(1, math.ceil(remaining / max(1, cfg.frames_per_system())))
            if pool is not None:
                batch = max(batch, workers)
            ids = list(range(next_system, next_system + batch))
            next_system += batch
            jobs = [(cfg, s) for s in ids]
            results = pool.imap(_worker, jobs) if pool is not None else map(_worker, jobs)
            for res in results:
                if frames_written >= cfg.frames:
                    break
                info = res["info"]
                split = "val" if _is_val(info["system"], cfg.val_fraction) else "train"
                frames = res["s2ef"][: cfg.frames - frames_written]
                for fr in frames:
                    writers[("s2ef", split)].add(fr)
                frames_written += len(frames)
                writers[("is2re", split)].add(res["is2re"])
                info["split"] = split
                systems.append(info)
                if verbose and len(systems) % 25 == 0:
                    rate = frames_written / max(time.time() - t0, 1e-9)
                    print(f"[est.data.generate] {len(systems)} systems, {frames_written}/{cfg.frames} frames "
                          f"({rate:.0f} frames/s)", file=sys.stderr)
        for w in writers.values():
            w.close()
    except BaseException:
        for w in writers.values():
            w.abort()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
    elapsed = time.time() - t0
    counts = {f"{task}/{split}": len(w) for (task, split), w in writers.items()}
    manifest = {
        "format": "est OC20-layout EMT dataset",
        "file_format": file_format,
        "config": asdict(cfg),
        "counts": counts,
        "gas_references_eV": gas_references(),
        "energy_reference": "E_ref = E_EMT - E_EMT(relaxed clean slab) - sum_adsorbate mu_X; "
                            "mu_H=E(H2)/2, mu_O=E(H2O)-E(H2), mu_C=E(CO)-mu_O, mu_N=E(N2)/2 (EMT-relaxed gas molecules)",
        "tags": "0 sub-surface (fixed), 1 surface (top two layers, free), 2 adsorbate",
        "seconds": round(elapsed, 2),
        "frames_per_second": round(frames_written / max(elapsed, 1e-9), 1),
        "workers": workers,
        "systems": systems,
    }
    with open(os.path.join(tmp, "manifest.json"), "w") as fh:
        json.dump(manifest, fh, indent=1)
    if os.path.exists(out):
        shutil.rmtree(out) if os.path.isdir(out) else os.remove(out)
    os.replace(tmp, out)
    if verbose:
        print(f"[est.data.generate] wrote {counts} to {out} in {elapsed:.1f} s "
              f"({manifest['frames_per_second']} S2EF frames/s, {workers} worker(s))", file=sys.stderr)
    return manifest


def default_emt_dataset(cache_dir: Optional[str] = None, *, frames: int = 400, seed: int = 0, workers: int = 1) -> str:
    """Path of a small default EMT set, generated on first use into the cache folder (~20 s)."""
    from .cache import default_cache_dir

    path = os.path.join(default_cache_dir(cache_dir), f"emt-oc20-v1-frames{frames}-seed{seed}")
    if not os.path.isfile(os.path.join(path, "manifest.json")):
        generate(path, frames=frames, seed=seed, workers=workers, overwrite=os.path.exists(path), verbose=False)
    return path


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m est.data.generate", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output folder (OC20 layout)")
    p.add_argument("--frames", type=int, default=3000, help="S2EF frames in total (train + val)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=1, help="processes (results identical for any count)")
    p.add_argument("--metals", default=",".join(METALS))
    p.add_argument("--facets", default=",".join(FACETS))
    p.add_argument("--adsorbates", default=",".join(ADSORBATES))
    p.add_argument("--md-frames", type=int, default=12)
    p.add_argument("--md-stride", type=int, default=4)
    p.add_argument("--relax-frames", type=int, default=8)
    p.add_argument("--relax-steps", type=int, default=60)
    p.add_argument("--optimizer", choices=("lbfgs", "bfgs"), default="lbfgs")
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--samples-per-shard", type=int, default=5000)
    p.add_argument("--format", choices=FORMATS, default="lmdb",
                   help="lmdb: OC20-layout LMDB (default); aselmdb: fairchem 2.x ASE LMDB (needs ase-db-backends)")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    cfg = EMTConfig(
        frames=a.frames, seed=a.seed, metals=tuple(a.metals.split(",")), facets=tuple(a.facets.split(",")),
        adsorbates=tuple(a.adsorbates.split(",")), md_frames=a.md_frames, md_stride=a.md_stride,
        relax_frames=a.relax_frames, relax_steps=a.relax_steps, optimizer=a.optimizer,
        val_fraction=a.val_fraction, samples_per_shard=a.samples_per_shard,
    )
    generate(a.out, cfg, workers=a.workers, overwrite=a.overwrite, verbose=not a.quiet, file_format=a.format)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
