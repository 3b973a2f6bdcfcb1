"""GFN2-xTB MD generator (est.data.xtb) and its molecules: labels, layout, resume, SCF failures, bad input."""
import json
import os
import shutil

import numpy as np
import torch
import pytest

pytest.importorskip("tblite")

from ase.calculators.calculator import CalculationFailed
from tblite.ase import TBLite

import est.data.xtb as xtb
from est.data import LmdbDataset
from est.data.molecules import BONDS, MOLECULES, bond_counts, molecule, zmatrix_to_positions
from est.data.xtb import XTBConfig, generate, main

# a few frames of ethanol, every path of the generator (chunks of 2 frames, a short equilibration)
TINY = dict(molecules=("ethanol",), train_frames=5, test_frames=2, stride=3, equilibration_steps=6,
            chunk_frames=2, seed=1)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Direct tblite calls here with one OpenMP thread, as the generator's (many threads crawl on a busy machine)."""
    with xtb.openmp_threads(1):
        yield


def _records(folder):
    ds = LmdbDataset(folder)
    return [ds.get_record(i) for i in range(len(ds))]


def _same_set(a, b):
    """Every record of every split of two sets, compared bit for bit."""
    for sub in ("ethanol/train", "ethanol/test", "mixed/train", "mixed/test"):
        ra, rb = _records(a / sub), _records(b / sub)
        assert len(ra) == len(rb), sub
        for x, y in zip(ra, rb):
            assert sorted(x) == sorted(y)
            for k in x:
                assert x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k]), (sub, k)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("xtb") / "set"
    return out, generate(str(out), verbose=False, **TINY)


def test_zmatrix_places_bond_angle_dihedral():
    rows = [("C",), ("C", 0, 1.5), ("C", 1, 1.4, 0, 110.0), ("C", 2, 1.3, 1, 100.0, 0, 60.0)]
    p = zmatrix_to_positions(rows)
    b = p[3] - p[2]
    assert np.linalg.norm(b) == pytest.approx(1.3)
    cos = np.dot(p[1] - p[2], b) / (np.linalg.norm(p[1] - p[2]) * 1.3)
    assert np.degrees(np.arccos(cos)) == pytest.approx(100.0)
    from ase import Atoms
    assert Atoms("C4", positions=p).get_dihedral(0, 1, 2, 3) == pytest.approx(60.0)


@pytest.mark.parametrize("name", MOLECULES)
def test_relaxed_molecule_is_the_intended_one(name):
    atoms, steps = xtb.relax(name, XTBConfig())
    assert atoms.get_chemical_formula() == molecule(name).get_chemical_formula()
    assert bond_counts(atoms) == BONDS[name]
    assert np.abs(atoms.get_forces()).max() < 0.01 and steps >= 1


def test_layout_counts_and_manifest(tiny):
    out, manifest = tiny
    assert sorted(os.listdir(out)) == [".state", "ethanol", "manifest.json", "mixed"]
    assert sorted(os.listdir(out / "ethanol" / "train")) == [
        "data.0000.lmdb", "data.0001.lmdb", "data.0002.lmdb", "metadata.npz"]
    assert manifest["counts"] == {"ethanol/train": 5, "ethanol/test": 2, "mixed/train": 5, "mixed/test": 2}
    assert json.load(open(out / "manifest.json")) == json.loads(json.dumps(manifest))
    m = manifest["molecules"]["ethanol"]
    assert manifest["method"] == "GFN2-xTB" and manifest["config"]["temperature_K"] == 500.0
    assert set(manifest["versions"]) >= {"tblite", "ase", "numpy", "est"} and manifest["versions"]["tblite"]
    assert m["splits"]["train"]["skipped_frames"] == 0 and m["splits"]["train"]["md_steps"] == 6 + 5 * 3
    assert m["splits"]["train"]["seed_sequence"] != m["splits"]["test"]["seed_sequence"]
    assert m["mean_energy_eV"] == pytest.approx(np.mean([r["energy"][0] for r in _records(out / "ethanol/train")]))
    assert m["relaxed"]["bonds"] == BONDS["ethanol"] and manifest["config"]["threads"] == 1
    assert os.path.islink(out / "mixed" / "train" / "data.0000.lmdb")


def test_records_are_molecules_with_xtb_labels(tiny):
    out, _ = tiny
    train, test = _records(out / "ethanol/train"), _records(out / "ethanol/test")
    assert {int(r["sid"][0]) for r in train} == {0} and {int(r["sid"][0]) for r in test} == {1}
    assert [int(r["fid"][0]) for r in train] == list(range(5))
    assert not any(np.array_equal(a["pos"], b["pos"]) for a in train for b in test)  # separate trajectories
    atoms = molecule("ethanol")
    atoms.calc = TBLite(method="GFN2-xTB", verbosity=0)
    for r in train[:2] + test[:1]:
        assert set(r) == {"pos", "atomic_numbers", "natoms", "cell", "pbc", "fixed", "tags", "energy", "forces",
                          "sid", "fid"}
        assert not r["pbc"].any() and not r["cell"].any() and not r["fixed"].any() and not r["tags"].any()
        assert np.array_equal(r["atomic_numbers"], atoms.numbers)
        atoms.positions = r["pos"].astype(np.float64)
        # a direct single point from the default (SAD) guess, against the MD's warm-started SCF
        assert r["energy"][0] == pytest.approx(atoms.get_potential_energy(), abs=2e-4)
        np.testing.assert_allclose(r["forces"], atoms.get_forces(), atol=2e-4)


def test_forces_are_minus_energy_gradient(tiny):
    out, _ = tiny
    r = _records(out / "ethanol/train")[-1]
    atoms = molecule("ethanol")
    atoms.calc = TBLite(method="GFN2-xTB", verbosity=0, accuracy=0.01)
    pos0, h = r["pos"].astype(np.float64), 1e-3
    for atom, axis in ((0, 0), (2, 1), (8, 2)):  # C, O, H
        e = []
        for s in (1, -1):
            atoms.positions = pos0
            atoms.positions[atom, axis] += s * h
            e.append(atoms.get_potential_energy())
        assert -(e[0] - e[1]) / (2 * h) == pytest.approx(float(r["forces"][atom, axis]), abs=2e-3)


def test_loads_for_training(tiny, tmp_path):
    from est.train.config import load_config
    from est.train.trainer import Trainer

    out, _ = tiny
    ds = LmdbDataset(out / "mixed" / "train")
    assert len(ds) == 5 and ds.natoms.tolist() == [9] * 5
    s = ds[0]
    assert s.pos.shape == (9, 3) and s.forces.shape == (9, 3) and s.energy.shape == (1,)
    cfg = load_config(["data=oc20_s2ef", "model._target_=test_train_helpers.PairModel", "model.name=pair",
                       "model.regress_forces=gradient", "model.use_pbc=false", f"data.train_path={out / 'mixed/train'}",
                       f"data.val_path={out / 'mixed/test'}", "data.batch_size=2", "data.num_workers=0",
                       "trainer.max_steps=2", "trainer.progress=false", "trainer.plots=false",
                       "trainer.final_splits=[val]", f"run_dir={tmp_path / 'run'}"], check=False)
    tr = Trainer(cfg)
    assert tr.fit() == "finished" and np.isfinite(tr.final_results["val"]["forces_mae"])


def test_same_seed_same_bytes(tiny, tmp_path):
    out, _ = tiny
    generate(str(tmp_path / "again"), verbose=False, **TINY)
    _same_set(out, tmp_path / "again")
    other = generate(str(tmp_path / "seed2"), verbose=False, **{**TINY, "seed": 2, "train_frames": 1, "test_frames": 0})
    assert other["counts"]["ethanol/train"] == 1
    assert not np.array_equal(_records(out / "ethanol/train")[0]["pos"], _records(tmp_path / "seed2/ethanol/train")[0]["pos"])


class _Flaky(TBLite):
    """TBLite that fails (raises, or returns NaN) on chosen calls, counted over all instances."""

    calls = 0
    fail_at: dict = {}

    def calculate(self, *args, **kwargs):
        super().calculate(*args, **kwargs)
        type(self).calls += 1
        what = self.fail_at.get(type(self).calls)
        if what == "raise":
            raise CalculationFailed("SCF not converged (injected)")
        if what == "nan":
            self.results["forces"] = self.results["forces"] * np.nan
        if what == "kill":
            raise KeyboardInterrupt


def _flaky(monkeypatch, *, frames: int, fail_at: dict):
    """Calculators that fail on calls ``fail_at`` (1 = the first SCF) of the train chunk starting at frame ``frames``."""
    _Flaky.calls, _Flaky.fail_at = 0, {}
    monkeypatch.setattr(xtb, "xtb_calculator", lambda method="GFN2-xTB": _Flaky(method=method, verbosity=0))
    real = xtb._run_chunk

    def arm(relaxed, state, n, cfg, sid):
        if sid == 0 and state["frames"] == frames:
            _Flaky.fail_at = {_Flaky.calls + k: what for k, what in fail_at.items()}
        return real(relaxed, state, n, cfg, sid)

    monkeypatch.setattr(xtb, "_run_chunk", arm)


def test_failed_scf_skips_the_frame(tiny, tmp_path, monkeypatch):
    out, _ = tiny
    # chunk 1 (frames 2, 3): its first frame costs 1 + 3 SCF calls (start point + stride), the next 3;
    # call 6 fails in frame 3 (raises), then, restarted from frame 2, call 10 returns NaN forces in frame 3
    _flaky(monkeypatch, frames=2, fail_at={6: "raise", 10: "nan"})
    m = generate(str(tmp_path / "flaky"), verbose=False, **TINY)
    train = m["molecules"]["ethanol"]["splits"]["train"]
    assert train["skipped_frames"] == 2 and train["frames"] == 5 and m["skipped_frames"] == 2
    assert m["molecules"]["ethanol"]["splits"]["test"]["skipped_frames"] == 0
    recs, clean = _records(tmp_path / "flaky/ethanol/train"), _records(out / "ethanol/train")
    assert len(recs) == 5 and all(np.isfinite(r["forces"]).all() and np.isfinite(r["energy"]).all() for r in recs)
    assert [int(r["fid"][0]) for r in recs] == list(range(5))
    for a, b in zip(recs[:3], clean[:3]):  # before the failure: the same trajectory, bit for bit
        assert np.array_equal(a["pos"], b["pos"]) and np.array_equal(a["forces"], b["forces"])
    assert not np.array_equal(recs[3]["pos"], clean[3]["pos"])  # after it: new noise from frame 2
    # failing every time is an error naming the cause, not an endless loop
    monkeypatch.undo()
    _flaky(monkeypatch, frames=0, fail_at={k: "raise" for k in range(1, 1000)})
    with pytest.raises(xtb.SCFError, match="failed 11 times in a row"):
        generate(str(tmp_path / "broken"), verbose=False, **TINY)


def test_killed_generation_resumes_bit_for_bit(tiny, tmp_path, monkeypatch):
    out, _ = tiny
    _flaky(monkeypatch, frames=4, fail_at={2: "kill"})  # killed inside the train trajectory's third chunk
    with pytest.raises(KeyboardInterrupt):
        generate(str(tmp_path / "b"), verbose=False, **TINY)
    assert sorted(os.listdir(tmp_path / "b/ethanol/train")) == ["data.0000.lmdb", "data.0001.lmdb"]
    assert not (tmp_path / "b" / "manifest.json").exists()
    monkeypatch.undo()
    # killed between a chunk file and its state: the chunk is redone
    real_save = xtb._save_state

    def save_then_die(path, state, seconds):
        if path.endswith("state.0003.npz"):
            raise KeyboardInterrupt
        real_save(path, state, seconds)

    monkeypatch.setattr(xtb, "_save_state", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        generate(str(tmp_path / "b"), verbose=False, **TINY)
    assert "data.0002.lmdb" in os.listdir(tmp_path / "b/ethanol/train")
    monkeypatch.undo()
    m = generate(str(tmp_path / "b"), verbose=False, **TINY)
    assert m["counts"]["ethanol/train"] == 5
    _same_set(out, tmp_path / "b")


def test_bad_input(tmp_path, tiny, capsys):
    with pytest.raises(ValueError, match="unknown molecule.*'benzene'.*known molecules: ethanol, malonaldehyde"):
        XTBConfig(molecules=("benzene",))
    with pytest.raises(ValueError, match="unknown molecule"):
        molecule("benzene")
    for bad in (dict(stride=0), dict(train_frames=-1), dict(temperature_K=float("nan")), dict(molecules=())):
        with pytest.raises(ValueError):
            XTBConfig(**bad)
    for argv, msg in ((["--out", str(tmp_path / "x"), "--molecules", "benzene"], "known molecules"),
                      (["--out", str(tmp_path / "x"), "--stride", "0"], "stride must be >= 1"),
                      (["--out", str(tmp_path / "x"), "--train-frames", "two"], "invalid int value"),
                      (["--molecules", "ethanol"], "--out is required")):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2 and msg in capsys.readouterr().err
    out, _ = tiny
    with pytest.raises(ValueError, match="other settings.*stride: 3 -> 4"):
        generate(str(out), verbose=False, **{**TINY, "stride": 4})
    (tmp_path / "taken").mkdir()
    with pytest.raises(FileExistsError, match="not a \\(partial\\) xTB set"):
        generate(str(tmp_path / "taken"), verbose=False, **TINY)


def test_cli_resumes_a_finished_set(tiny):
    out, manifest = tiny
    args = ["--out", str(out), "--molecules", "ethanol", "--train-frames", "5", "--test-frames", "2", "--stride", "3",
            "--equilibration-steps", "6", "--chunk-frames", "2", "--seed", "1", "--quiet"]
    assert main(args) == 0
    again = json.load(open(out / "manifest.json"))
    assert again["counts"] == manifest["counts"] and again["molecules"] == json.loads(json.dumps(manifest["molecules"]))


def test_a_second_call_adds_molecules_to_the_manifest(tiny, tmp_path):
    """Generating malonaldehyde into a finished ethanol set keeps ethanol in the manifest and in mixed/."""
    src, first = tiny
    out = tmp_path / "set"
    shutil.copytree(src, out, symlinks=True)
    m = generate(str(out), verbose=False, **{**TINY, "molecules": ("malonaldehyde",)})
    assert list(m["molecules"]) == ["ethanol", "malonaldehyde"]
    assert list(m["config"]["molecules"]) == ["ethanol", "malonaldehyde"]
    assert m["molecules"]["ethanol"] == json.loads(json.dumps(first["molecules"]["ethanol"]))
    assert m["counts"] == {"ethanol/train": 5, "ethanol/test": 2, "malonaldehyde/train": 5, "malonaldehyde/test": 2,
                           "mixed/train": 10, "mixed/test": 4}
    sids = [int(np.reshape(r["sid"], -1)[0]) for r in _records(out / "mixed" / "train")]
    assert sids == [0] * 5 + [2] * 5  # ethanol's trajectory first: the earlier call's order
    assert json.load(open(out / "manifest.json")) == json.loads(json.dumps(m))
    again = generate(str(out), verbose=False, **TINY)  # ethanol alone again: malonaldehyde stays listed
    assert list(again["config"]["molecules"]) == ["ethanol", "malonaldehyde"] and again["counts"] == m["counts"]
    # a manifest that lost ethanol (the generator wrote one before it kept earlier calls) is repaired by asking for it
    (out / "manifest.json").write_text(json.dumps({**again, "config": {**again["config"], "molecules": ["malonaldehyde"]}}))
    repaired = generate(str(out), verbose=False, **TINY)
    assert list(repaired["config"]["molecules"]) == ["malonaldehyde", "ethanol"]
    assert repaired["molecules"]["ethanol"] == again["molecules"]["ethanol"]


def test_missing_tblite_is_a_clear_error(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_tblite(name, *a, **k):
        if name.startswith("tblite"):
            raise ImportError("No module named 'tblite'")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_tblite)
    with pytest.raises(ImportError, match="pip install tblite"):
        xtb.xtb_calculator()


def test_aselmdb_format_matches_lmdb(tiny, tmp_path):
    """``--format aselmdb``: the same frames as the LMDB set, read back with est's reader; an empty split has no file."""
    pytest.importorskip("ase_db_backends")
    from est.data import AseLmdbDataset, open_dataset

    out, manifest = tiny
    ase_out = tmp_path / "ase"
    assert main(["--out", str(ase_out), "--molecules", "ethanol", "--train-frames", "5", "--test-frames", "2",
                 "--stride", "3", "--equilibration-steps", "6", "--chunk-frames", "2", "--seed", "1", "--quiet",
                 "--format", "aselmdb"]) == 0
    m = json.load(open(ase_out / "manifest.json"))
    assert m["file_format"] == "aselmdb" and m["counts"] == manifest["counts"]
    assert sorted(os.listdir(ase_out / "ethanol" / "train")) == [
        "data.0000.aselmdb", "data.0001.aselmdb", "data.0002.aselmdb", "metadata.npz"]
    for sub in ("ethanol/train", "ethanol/test", "mixed/train", "mixed/test"):
        a, b = open_dataset(ase_out / sub), LmdbDataset(out / sub)
        assert isinstance(a, AseLmdbDataset) and len(a) == len(b) and a.natoms.tolist() == b.natoms.tolist()
        for i in range(len(b)):
            x, y = a[i], b[i]
            assert torch.equal(x.atomic_numbers, y.atomic_numbers)
            for k in ("pos", "energy", "forces", "cell"):
                torch.testing.assert_close(getattr(x, k), getattr(y, k), rtol=0, atol=0, msg=f"{sub} {i} {k}")
            assert int(x.sid) == int(y.sid) and int(x.fid) == int(y.fid)
    # resuming with the other format is refused; an empty split has no data file, only metadata
    with pytest.raises(ValueError, match="file_format: aselmdb -> lmdb"):
        generate(str(ase_out), verbose=False, **TINY)
    empty = generate(str(tmp_path / "empty"), verbose=False, **{**TINY, "test_frames": 0, "file_format": "aselmdb"})
    assert empty["counts"]["ethanol/test"] == 0 and os.listdir(tmp_path / "empty/ethanol/test") == ["metadata.npz"]
