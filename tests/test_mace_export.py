"""The est side of the MACE baseline (benchmarks/baseline/mace_baseline.py): no MACE needed.

LMDB -> extxyz export read back with ASE, the metric definitions, MACE's results
file folded over a resume, and the NVE helper with ASE's EMT as the calculator.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

MODULE = Path(__file__).resolve().parent.parent / "benchmarks" / "baseline" / "mace_baseline.py"


@pytest.fixture(scope="module")
def mb():
    spec = importlib.util.spec_from_file_location("mace_baseline_under_test", MODULE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop(spec.name, None)


def _ethanol_frames(n: int, seed: int = 0):
    """``n`` rattled ethanol geometries with EMT energies and forces (eV, eV/A)."""
    from ase.build import molecule
    from ase.calculators.emt import EMT

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        a = molecule("CH3CH2OH")
        a.positions += rng.normal(scale=0.05, size=a.positions.shape)
        a.calc = EMT()
        out.append((a, a.get_potential_energy(), a.get_forces()))
    return out


def _write_lmdb(path, frames, *, with_forces=True):
    from est.data import LmdbWriter, atoms_to_sample

    with LmdbWriter(path) as w:
        for k, (a, e, f) in enumerate(frames):
            w.add(atoms_to_sample(a, energy=np.array([e]), forces=f if with_forces else None, sid=7, fid=k))


def test_export_round_trip(mb, tmp_path):
    """Positions, numbers, energies and forces come back from the xyz as written (float32 storage)."""
    from ase.io import read

    frames = _ethanol_frames(4)
    _write_lmdb(tmp_path / "db", frames)
    info = mb.export_xyz(tmp_path / "db", tmp_path / "out" / "train.xyz")
    assert info == {"path": str(tmp_path / "out" / "train.xyz"), "frames": 4, "atoms": 36}
    back = read(tmp_path / "out" / "train.xyz", index=":", format="extxyz")
    assert len(back) == 4
    for k, ((a, e, f), b) in enumerate(zip(frames, back)):
        assert b.get_chemical_symbols() == a.get_chemical_symbols()
        np.testing.assert_allclose(b.positions, a.positions, atol=1e-5)
        assert b.info[mb.ENERGY_KEY] == pytest.approx(e, rel=1e-6)
        np.testing.assert_allclose(b.arrays[mb.FORCES_KEY], f, atol=1e-5)
        assert not b.pbc.any() and b.info["fid"] == k and b.info["sid"] == 7
        assert b.calc is None  # REF_ keys: ASE does not turn them into a calculator
    assert not list((tmp_path / "out").glob(".*tmp*"))
    assert mb.export_xyz(tmp_path / "db", tmp_path / "two.xyz", limit=2)["frames"] == 2


def test_export_keeps_periodic_cell(mb, tmp_path):
    from ase.build import bulk
    from ase.calculators.emt import EMT
    from ase.io import read

    a = bulk("Cu", "fcc", a=3.6, cubic=True)
    a.calc = EMT()
    _write_lmdb(tmp_path / "db", [(a, a.get_potential_energy(), a.get_forces())])
    mb.export_xyz(tmp_path / "db", tmp_path / "cu.xyz")
    b = read(tmp_path / "cu.xyz", format="extxyz")
    assert b.pbc.all()
    np.testing.assert_allclose(b.cell.array, a.cell.array, atol=1e-6)


def test_export_refuses_frames_without_forces(mb, tmp_path):
    _write_lmdb(tmp_path / "db", _ethanol_frames(1), with_forces=False)
    with pytest.raises(ValueError, match="no energy/forces"):
        mb.export_xyz(tmp_path / "db", tmp_path / "x.xyz")
    assert not (tmp_path / "x.xyz").exists()


def test_force_metrics_definitions(mb):
    e_ref, e_pred, n = [1.0, 2.0], [1.3, 1.6], [2, 4]
    f_ref = np.array([[1.0, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0], [0, 0, 2], [3, 0, 0]])
    f_pred = f_ref.copy()
    f_pred[0] = [0, 1, 0]  # perpendicular: cosine 0
    f_pred[5] = [-3, 0, 0]  # opposite: cosine -1
    m = mb.force_metrics(e_pred, e_ref, n, f_pred, f_ref)
    assert m["energy_mae_meV"] == pytest.approx(1000 * (0.3 + 0.4) / 2)
    assert m["energy_mae_meV_atom"] == pytest.approx(1000 * (0.3 / 2 + 0.4 / 4) / 2)
    assert m["forces_mae_meV_A"] == pytest.approx(1000 * (1 + 1 + 6) / 18)
    assert m["forces_cos"] == pytest.approx((0 + 4 - 1) / 6)
    with pytest.raises(ValueError, match="forces"):
        mb.force_metrics(e_pred, e_ref, [2, 3], f_pred, f_ref)


def write_results(run_dir, rows) -> None:
    """MACE's results file of ``rows`` ``(mode, epoch, seconds)``: ``eval`` rows with a force MAE of
    0.1 / (1 + epoch) eV/A (0.2 before training)."""
    res = run_dir / "results"
    res.mkdir()
    with open(res / "mace_run-0_train.txt", "w") as f:
        for mode, epoch, t in rows:
            r = {"mode": mode, "epoch": epoch, "time": t}
            if mode == "eval":
                r.update(mae_e_per_atom=0.01, mae_f=0.2 if epoch is None else 0.1 / (1 + (epoch or 0)))
            f.write(json.dumps(r) + "\n")


#: a run killed in epoch 3 after checkpointing epoch 2: epochs 0-2 done, epoch 3 begun
KILLED = [("eval", None, 0.5)] + [("opt", e, 1.0) for e in (0, 0, 1, 1, 2, 2)] \
    + [("eval", 0, 0.1), ("eval", 1, 0.1), ("eval", 2, 0.1), ("opt", 3, 1.0)]


def test_results_file_counts_the_epoch_a_plain_mace_restart_trains_twice(mb, tmp_path):
    """MACE restarted on its epoch-2 checkpoint trains epoch 2 again from weights that went through it: the
    curve counts every step the weights saw (epoch 2 twice), not the killed start's epoch 3."""
    write_results(tmp_path, KILLED + [("eval", None, 0.5), ("opt", 2, 2.0), ("opt", 2, 2.0), ("eval", 2, 0.1),
                                      ("opt", 3, 2.0), ("opt", 3, 2.0), ("eval", 3, 0.1)])
    curve = mb.learning_curve(tmp_path)
    assert [c["epoch"] for c in curve] == [0, 1, 2, 2, 3]
    assert [c["steps"] for c in curve] == [2, 4, 6, 8, 10]
    assert [c["opt_seconds"] for c in curve] == [2.0, 4.0, 6.0, 10.0, 14.0]
    assert curve[-1]["forces_mae_meV_A"] == pytest.approx(25.0)
    t = mb.epoch_timing(tmp_path)
    assert t == {"epochs_run": 5, "steps_per_epoch": 2, "opt_s_per_epoch_median": 2.0, "opt_s_total": 14.0}
    assert mb.epoch_step_times(tmp_path) == [[1.0, 1.0]] * 3 + [[2.0, 2.0]] * 2


def checkpoint(folder, epoch: int, payload: bytes = b"weights"):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"mace_run-0_epoch-{epoch}.pt"
    path.write_bytes(payload)
    return path


def test_resume_starts_after_the_checkpoint_once_and_the_curve_counts_each_epoch_once(mb, tmp_path):
    """The latest checkpoint moves to the next epoch once (a second resume before a newer checkpoint leaves it,
    a newer one MACE writes, even under the renamed name, moves); the folded curve of a renamed resume has
    each epoch once and drops the killed start's unfinished epoch."""
    ck = tmp_path / "checkpoints"
    assert mb.resume_after_checkpoint(tmp_path) is None  # nothing to resume
    checkpoint(ck, 1)
    checkpoint(ck, 2)
    assert mb.resume_after_checkpoint(tmp_path) == "mace_run-0_epoch-3.pt"
    assert sorted(p.name for p in ck.glob("*.pt")) == ["mace_run-0_epoch-1.pt", "mace_run-0_epoch-3.pt"]
    assert mb.resume_after_checkpoint(tmp_path) is None  # killed again before a new checkpoint: stays
    write_results(tmp_path, KILLED + [("eval", None, 0.5), ("opt", 3, 2.0), ("opt", 3, 2.0), ("eval", 3, 0.1)])
    curve = mb.learning_curve(tmp_path)
    assert [c["epoch"] for c in curve] == [0, 1, 2, 3] and [c["steps"] for c in curve] == [2, 4, 6, 8]
    assert [c["opt_seconds"] for c in curve] == [2.0, 4.0, 6.0, 10.0]
    import os
    import time

    later = time.time_ns() + 10**9
    path = checkpoint(ck, 3, b"weights after epoch 3")  # MACE saves epoch 3 under the renamed file's name
    os.utime(path, ns=(later, later))
    assert mb.resume_after_checkpoint(tmp_path) == "mace_run-0_epoch-4.pt"
    assert [r["epoch"] for r in json.loads((ck / mb.RESUME_NOTE).read_text())["renamed"]] == [3, 4]


def test_train_config_and_arguments(mb):
    cfg = mb.MaceTrainConfig(seed=3, epochs=7)
    argv = mb.train_argv(cfg, train_xyz="a.xyz", test_xyz="b.xyz", run_dir="r")
    for flag in ("--num_interactions=2", "--num_channels=64", "--max_L=2", "--correlation=3", "--r_max=5.0",
                 "--E0s=average", "--energy_key=REF_energy", "--forces_key=REF_forces", "--seed=3",
                 "--max_num_epochs=7", "--restart_latest", "--valid_fraction=0.05", "--test_file=b.xyz",
                 "--default_dtype=float64", "--forces_weight=100.0", "--energy_weight=1.0"):
        assert flag in argv
    assert "--valid_file=v.xyz" in mb.train_argv(cfg, train_xyz="a", test_xyz=None, run_dir="r", valid_xyz="v.xyz")
    assert cfg.steps_per_epoch(2000) == 190  # 100 frames held out, last partial batch dropped
    assert cfg.epochs_for_steps(1000, 2000) == 6
    with pytest.raises(ValueError, match="default_dtype"):
        mb.MaceTrainConfig(default_dtype="float16")


def test_allocator_of_the_mace_process_is_the_configs_not_the_shells(mb, monkeypatch):
    """``keep_freed_memory`` sets glibc's variables for MACE's process; without it they are removed even when
    the calling shell has them, so a run's speed does not depend on how its parent was started. The flag is
    no ``run_train`` argument, and the CLI takes it as a switch."""
    monkeypatch.setenv("MALLOC_MMAP_MAX_", "0")
    env = mb._thread_env(1)
    assert not any(k in env for k in mb.KEEP_FREED_ENV) and env["OMP_NUM_THREADS"] == "1"
    monkeypatch.delenv("MALLOC_MMAP_MAX_")
    assert {k: mb._thread_env(2, True)[k] for k in mb.KEEP_FREED_ENV} == mb.KEEP_FREED_ENV
    from est.train import malloc  # the environment form sets what est's in-process switch sets

    assert mb.KEEP_FREED_ENV == {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(malloc.TRIM_BYTES)}
    cfg = mb.MaceTrainConfig(keep_freed_memory=True)
    assert not any("keep_freed" in a or "malloc" in a.lower() for a in mb.train_argv(cfg, train_xyz="a", test_xyz=None,
                                                                                         run_dir="r"))
    seen = []
    monkeypatch.setattr(mb, "train", lambda cfg, **kw: seen.append(cfg) or {})
    for flags, want in (([], False), (["--keep-freed-memory"], True), (["--no-keep-freed-memory"], False)):
        mb.main(["train", "--train", "a.xyz", "--run-dir", "r", *flags])
        assert seen[-1].keep_freed_memory is want and seen[-1].epochs == 50


def test_nve_md_with_an_ase_calculator(mb):
    """The MD helper needs only an ASE calculator: a relaxed EMT Cu13 stays together and conserves energy;
    a shrunken reference geometry makes every bond look stretched 1.67x and flags a break."""
    from ase.calculators.emt import EMT
    from ase.cluster import Icosahedron
    from ase.optimize import BFGS

    a = Icosahedron("Cu", 2)
    a.calc = EMT()
    BFGS(a, logfile=None).run(fmax=0.01, steps=100)
    out = mb.nve_md(a, EMT(), steps=60, timestep_fs=1.0, seed=1)
    assert out["steps"] == 60 and out["bonds"] == 42 and out["intact"] and not out["failed"]
    assert abs(out["drift_meV_atom_ps"]) < 1.0 and 0 < out["max_dev_meV_atom"] < 0.1
    assert 1.0 < out["max_bond_stretch"] < 1.2
    squeezed = a.copy()
    squeezed.positions *= 0.6
    out = mb.nve_md(a, EMT(), steps=2, reference=squeezed)
    assert not out["intact"] and out["max_bond_stretch"] > 1.5


def test_nve_md_resumes_bit_for_bit(mb, tmp_path):
    """A trajectory killed after its last checkpoint and started again ends where the uninterrupted one ends,
    bit for bit; the state file goes once the run is done, and a checkpoint of other settings is not used."""
    from ase.calculators.emt import EMT
    from ase.cluster import Icosahedron

    a = Icosahedron("Cu", 2)
    whole = mb.nve_md(a, EMT(), steps=30, timestep_fs=1.0, seed=3)
    state = tmp_path / "md_state.json"

    class Killed(EMT):  # dies at its 20th force call (step 19), after the checkpoint of step 10
        calls = 0

        def calculate(self, *args, **kwargs):
            Killed.calls += 1
            if Killed.calls == 20:
                raise KeyboardInterrupt("killed")
            super().calculate(*args, **kwargs)

    with pytest.raises(KeyboardInterrupt):
        mb.nve_md(a, Killed(), steps=30, timestep_fs=1.0, seed=3, checkpoint=str(state), checkpoint_every=10)
    saved = json.loads(state.read_text())
    assert saved["done"] == 10 and len(saved["etot"]) == 11
    resumed = mb.nve_md(a, EMT(), steps=30, timestep_fs=1.0, seed=3, checkpoint=str(state), checkpoint_every=10)
    assert not state.exists()
    for k in ("steps", "drift_meV_atom_ps", "max_dev_meV_atom", "max_bond_stretch", "T_end_K"):
        assert resumed[k] == whole[k], k
    state.write_text(json.dumps(dict(saved, key=dict(saved["key"], seed=4))))
    other = mb.nve_md(a, EMT(), steps=30, timestep_fs=1.0, seed=3, checkpoint=str(state), checkpoint_every=10)
    assert other["T_end_K"] == whole["T_end_K"] and not state.exists()
