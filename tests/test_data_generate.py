"""OC20-layout EMT generator: layout, physics, tags/fixed, references, determinism, CLI."""
import json
import os

import numpy as np
import pytest
import torch

from est.data import LmdbDataset
from est.data.generate import EMTConfig, generate, generate_system, gas_references, clean_slab_energy, main

TINY = dict(metals=("Cu", "Pt"), facets=("111", "211"), adsorbates=("O", "CO", "OH"),
            md_frames=3, md_stride=2, relax_frames=3, relax_steps=8)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("emt") / "set"
    manifest = generate(str(out), frames=14, seed=3, verbose=False, **TINY)
    return out, manifest


def test_layout_and_counts(tiny):
    out, manifest = tiny
    assert sorted(os.listdir(out)) == ["is2re", "manifest.json", "s2ef"]
    assert os.path.isfile(out / "s2ef" / "train" / "data.0000.lmdb")
    assert os.path.isfile(out / "s2ef" / "train" / "metadata.npz")
    assert os.path.isfile(out / "is2re" / "val" / "data.lmdb")
    c = manifest["counts"]
    assert c["s2ef/train"] + c["s2ef/val"] == 14
    assert c["s2ef/val"] > 0 and c["is2re/val"] > 0
    assert json.load(open(out / "manifest.json"))["counts"] == c


def test_samples_follow_oc20_conventions(tiny):
    out, manifest = tiny
    ds = LmdbDataset(out / "s2ef" / "train")
    assert ds.natoms is not None and len(ds.natoms) == len(ds)
    for i in range(len(ds)):
        s = ds[i]
        assert set(s.tags.unique().tolist()) == {0, 1, 2}
        assert torch.equal(s.fixed, (s.tags == 0).long())
        assert s.pbc.tolist() == [[True, True, False]] and s.cell.abs().sum() > 0
        assert s.forces.shape == s.pos.shape and torch.isfinite(s.energy).all()
        assert s.energy.abs().item() < 50  # referenced (adsorption-like) energies, not totals
        metals = set(s.atomic_numbers[s.tags < 2].tolist())
        assert metals <= {29, 78} and len(metals) == 1
        assert set(s.atomic_numbers[s.tags == 2].tolist()) <= {1, 6, 7, 8}
    is2re = LmdbDataset(out / "is2re" / "train" / "data.lmdb", extra_fields=("pos_relaxed", "y_init"))
    s = is2re[0]
    assert s.pos_relaxed.shape == s.pos.shape and "forces" not in s


def test_energy_reference_and_forces_are_emt():
    from ase import Atoms
    from ase.calculators.emt import EMT

    cfg = EMTConfig(frames=6, seed=5, **TINY)
    res = generate_system(cfg, 0)
    info, fr = res["info"], res["s2ef"][-1]
    atoms = Atoms(numbers=fr["atomic_numbers"], positions=fr["pos"].astype(np.float64),
                  cell=fr["cell"][0].astype(np.float64), pbc=fr["pbc"][0])
    atoms.calc = EMT()
    gas = gas_references()
    ads = [a.symbol for a, t in zip(atoms, fr["tags"]) if t == 2]
    offset = clean_slab_energy(info["metal"], info["facet"], tuple(info["size"]), cfg.vacuum) + sum(gas[x] for x in ads)
    assert fr["energy"][0] == pytest.approx(atoms.get_potential_energy() - offset, abs=2e-4)
    np.testing.assert_allclose(fr["forces"], atoms.get_forces(), atol=2e-4)
    assert gas["H"] == pytest.approx(gas["E_H2"] / 2)


def test_deterministic_for_a_seed():
    cfg = EMTConfig(frames=6, seed=11, **TINY)
    a, b = generate_system(cfg, 2), generate_system(cfg, 2)
    assert a["info"] == b["info"]
    for fa, fb in zip(a["s2ef"], b["s2ef"]):
        for k in fa:
            assert np.array_equal(fa[k], fb[k]), k
    c = generate_system(EMTConfig(frames=6, seed=12, **TINY), 2)
    assert not np.array_equal(a["is2re"]["pos"], c["is2re"]["pos"]) or a["info"] != c["info"]


def test_cli_refuses_overwrite(tmp_path, tiny):
    out, _ = tiny
    with pytest.raises(FileExistsError, match="overwrite"):
        main(["--out", str(out), "--frames", "2", "--quiet"])
    dest = tmp_path / "cli"
    assert main(["--out", str(dest), "--frames", "3", "--metals", "Ag", "--facets", "100", "--adsorbates", "H",
                 "--md-frames", "2", "--relax-frames", "1", "--relax-steps", "3", "--quiet"]) == 0
    assert len(LmdbDataset(dest / "s2ef" / "train")) == 3
    with pytest.raises(ValueError, match="EMT"):
        generate(str(tmp_path / "bad"), frames=1, metals=("Fe",), verbose=False)


def test_same_set_for_any_worker_count(tmp_path, tiny):
    out, manifest = tiny
    other = tmp_path / "w2"
    generate(str(other), frames=14, seed=3, workers=2, verbose=False, **TINY)
    for sub in ("s2ef/train", "s2ef/val", "is2re/train/data.lmdb"):
        a, b = LmdbDataset(out / sub), LmdbDataset(other / sub)
        assert len(a) == len(b)
        for i in range(len(a)):
            ra, rb = a.get_record(i), b.get_record(i)
            assert sorted(ra) == sorted(rb)
            for k in ra:
                assert np.array_equal(ra[k], rb[k]), (sub, i, k)


def test_default_set_generated_once(tmp_path, monkeypatch):
    from est.data import default_emt_dataset
    import est.data.generate as gen

    path = default_emt_dataset(tmp_path, frames=6)
    assert os.path.isfile(os.path.join(path, "manifest.json"))
    monkeypatch.setattr(gen, "generate", lambda *a, **k: (_ for _ in ()).throw(AssertionError("regenerated")))
    assert default_emt_dataset(tmp_path, frames=6) == path
