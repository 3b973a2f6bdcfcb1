"""fairchem 2.x .aselmdb files and folders (written by ase-db-backends itself) read as samples; our writer; the
EMT generator's --format aselmdb. The data folder is never written to."""
import hashlib
import os

import numpy as np
import pytest
import torch

import ase.db
from ase.build import add_adsorbate, fcc111, molecule
from ase.calculators.singlepoint import SinglePointCalculator
from ase.constraints import FixAtoms

from est.data import AseLmdbDataset, DataFileError, open_dataset, write_aselmdb
from est.data.aselmdb import AseLmdbWriter


def _slab(i: int):
    """OC20-like: Cu(111) slab + adsorbate, tags 0/1/2, sub-surface fixed, energy/forces/stress."""
    rng = np.random.default_rng(i)
    s = fcc111("Cu", size=(2, 2, 3), vacuum=6.0)
    add_adsorbate(s, ("O", "H", "N")[i % 3], 1.6, "fcc")
    tags = np.array([0] * 4 + [1] * 8 + [2])
    s.set_tags(tags)
    s.set_constraint(FixAtoms(mask=tags == 0))
    s.positions += rng.normal(0, 0.05, s.positions.shape)
    s.calc = SinglePointCalculator(s, energy=-10.0 - i, forces=rng.normal(size=(len(s), 3)), stress=rng.normal(size=6))
    return s


def _write_with_ase(path, structures, deleted=()):
    """Rows written by ase-db-backends through ASE's own connect (sid/fid pairs, OMol25-style charge/spin data)."""
    db = ase.db.connect(str(path), use_lock_file=False)
    for k, a in enumerate(structures):
        db.write(a, key_value_pairs={"sid": 100 + k, "fid": k},
                 data={"charge": k % 2, "spin": 1 + k % 2, "omat_energy": -1.0 * k, "ref_vector": np.arange(3.0) + k})
    if deleted:
        db.delete(list(deleted))
    db.close()
    del db
    lock = str(path) + "-lock"
    if os.path.exists(lock):
        os.remove(lock)  # ASE's writer leaves LMDB's lock file; a dataset folder as shipped has none


def _digest(folder):
    return {p: hashlib.sha256(open(os.path.join(folder, p), "rb").read()).hexdigest() for p in sorted(os.listdir(folder))}


@pytest.fixture
def folder(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    _write_with_ase(d / "a.aselmdb", [_slab(0), _slab(1), _slab(2)], deleted=[2])  # rows 1, 3
    mol = molecule("H2O")
    mol.calc = SinglePointCalculator(mol, energy=-14.2, forces=np.zeros((3, 3)))
    _write_with_ase(d / "b.aselmdb", [mol, _slab(3)])
    return d


def test_folder_rows_match_ase_and_nothing_is_written(folder, tmp_path):
    before = _digest(folder)
    rows = []  # ASE's own reading, first: py-lmdb opens a file once per process, and a dataset keeps its files open
    for name, rid in [("a.aselmdb", 1), ("a.aselmdb", 3), ("b.aselmdb", 1), ("b.aselmdb", 2)]:
        with ase.db.connect(str(folder / name), use_lock_file=False, readonly=True) as db:
            rows.append(db.get(id=rid))
    ds = open_dataset(folder)
    assert isinstance(ds, AseLmdbDataset) and len(ds) == 4  # 3 rows - 1 deleted, + 2
    cache = tmp_path / "cache"
    ds = AseLmdbDataset(folder, cache_dir=str(cache))
    assert ds.natoms.tolist() == [13, 13, 3, 13]
    for i, row in enumerate(rows):
        a = row.toatoms()
        s = ds[i]
        assert torch.allclose(s.pos.double(), torch.tensor(a.positions), atol=1e-6)
        assert s.atomic_numbers.tolist() == a.numbers.tolist() and s.tags.tolist() == a.get_tags().tolist()
        assert torch.allclose(s.cell[0].double(), torch.tensor(a.cell.array), atol=1e-6)
        assert s.pbc[0].tolist() == a.pbc.tolist()
        fixed = np.zeros(len(a), int)
        for c in a.constraints:
            fixed[c.get_indices()] = 1
        assert s.fixed.tolist() == fixed.tolist()
        assert s.energy.item() == pytest.approx(row.energy, abs=1e-5)
        assert torch.allclose(s.forces.double(), torch.tensor(row.forces), atol=1e-5)
        assert int(s.sid) == row.key_value_pairs["sid"] and int(s.fid) == row.key_value_pairs["fid"]
        assert int(s.charge) == row.data["charge"] and int(s.spin) == row.data["spin"]
    xx, yy, zz, yz, xz, xy = rows[0].stress
    assert torch.allclose(ds[0].stress[0].double(), torch.tensor([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]]), atol=1e-6)
    assert "stress" not in ds[2]  # the molecule has none
    # the atom-count index went to the cache folder, not the data folder; the files are byte-identical
    assert len(os.listdir(cache / "aselmdb-index")) == 2
    assert _digest(folder) == before


def test_key_map_extra_fields_and_batches(folder):
    from torch_geometric.data import Batch

    ds = AseLmdbDataset(folder, key_map={"energy": "omat_energy"}, extra_fields=("charge", "spin", "ref_vector"),
                        cache_dir=False)
    assert [ds[i].energy.item() for i in range(4)] == [0.0, -2.0, 0.0, -1.0]  # row ids 1, 3 | 1, 2
    b = Batch.from_data_list([ds[0], ds[1]])
    assert b.charge.tolist() == [0, 0] and b.spin.tolist() == [1, 1]  # scalars: one entry per structure
    assert b.ref_vector.tolist() == [0.0, 1.0, 2.0, 2.0, 3.0, 4.0]  # arrays as stored, concatenated (PyG)
    with pytest.raises(ValueError, match="unknown sample field"):
        AseLmdbDataset(folder, key_map={"energyy": "omat_energy"})


def test_workers_read_the_same_samples(folder):
    from torch.utils.data import DataLoader

    ds = AseLmdbDataset(folder, cache_dir=False)
    direct = [ds[i].pos for i in (3, 0, 2, 1)]
    loader = DataLoader(ds, batch_size=None, sampler=[3, 0, 2, 1], num_workers=2)
    got = [s.pos for s in loader]
    assert all(torch.equal(a, b) for a, b in zip(direct, got))
    assert sorted(os.listdir(folder)) == ["a.aselmdb", "b.aselmdb"]  # no lock files


def test_cached_index_is_reused(folder, tmp_path, monkeypatch):
    AseLmdbDataset(folder, cache_dir=str(tmp_path / "c")).natoms  # builds the index
    monkeypatch.setattr(AseLmdbDataset, "_count_file", lambda self, i: pytest.fail("index rebuilt"))
    assert AseLmdbDataset(folder, cache_dir=str(tmp_path / "c")).natoms.tolist() == [13, 13, 3, 13]


def test_empty_truncated_and_deleted(tmp_path):
    empty = tmp_path / "empty.aselmdb"
    empty.write_bytes(b"")
    with pytest.raises(DataFileError, match="empty.aselmdb: not an LMDB file"):
        AseLmdbDataset(empty)
    d = tmp_path / "d"
    d.mkdir()
    _write_with_ase(d / "x.aselmdb", [_slab(0), _slab(1)], deleted=[1, 2])
    with pytest.raises(DataFileError, match="no rows"):
        AseLmdbDataset(d)
    full = tmp_path / "full.aselmdb"
    _write_with_ase(full, [_slab(k) for k in range(30)])
    cut = tmp_path / "cut.aselmdb"
    cut.write_bytes(full.read_bytes()[: os.path.getsize(full) // 2])
    with pytest.raises(DataFileError, match="truncated"):
        AseLmdbDataset(cut)
    with pytest.raises(DataFileError, match="no such file"):
        AseLmdbDataset(tmp_path / "nope.aselmdb")


def test_writer_round_trip_with_natoms_metadata(tmp_path, folder):
    src = AseLmdbDataset(folder, cache_dir=False)
    out = tmp_path / "ours"
    assert write_aselmdb(out, [src[i] for i in range(len(src))], rows_per_file=3) == 4
    assert sorted(os.listdir(out)) == ["data.0000.aselmdb", "data.0001.aselmdb", "metadata.npz"]
    back = AseLmdbDataset(out, cache_dir=False)
    assert all(s is not None for s in back._stored)  # atom counts from the files' metadata, no row decoded
    assert back.natoms.tolist() == src.natoms.tolist()
    for i in range(len(src)):
        a, b = src[i], back[i]
        for key in ("pos", "atomic_numbers", "cell", "pbc", "fixed", "tags", "energy", "forces", "sid", "fid"):
            assert torch.allclose(getattr(a, key).double(), getattr(b, key).double(), atol=1e-6), key
    assert torch.allclose(src[0].stress, back[0].stress) and int(back[1].charge) == int(src[1].charge)
    # ASE reads our files too (once our dataset lets go of them)
    e0 = src[0].energy.item()
    del back
    import gc

    gc.collect()
    with ase.db.connect(str(out / "data.0000.aselmdb"), use_lock_file=False, readonly=True) as db:
        assert db.count() == 3 and db.get(id=1).energy == pytest.approx(e0, abs=1e-6)
    with pytest.raises(FileExistsError):
        AseLmdbWriter(out)
    with pytest.raises(ValueError, match="NaN"):
        with AseLmdbWriter(tmp_path / "bad.aselmdb") as w:
            a = _slab(0)
            a.positions[0, 0] = np.nan
            w.add(a)
    assert not (tmp_path / "bad.aselmdb").exists()


def test_generator_writes_aselmdb(tmp_path):
    from est.data.generate import generate

    out = tmp_path / "emt"
    m = generate(str(out), frames=6, seed=1, verbose=False, file_format="aselmdb", metals=("Cu",), facets=("111",),
                 adsorbates=("O",), md_frames=2, md_stride=1, relax_frames=2, relax_steps=4, val_fraction=0.5)
    assert m["file_format"] == "aselmdb"
    train = open_dataset(out / "s2ef" / "train")
    assert isinstance(train, AseLmdbDataset) and len(train) == m["counts"]["s2ef/train"]
    s = train[0]
    assert s.forces.shape == s.pos.shape and torch.equal(s.fixed, (s.tags == 0).long())
    is2re = open_dataset(out / "is2re" / "train" / "data.aselmdb")
    r = is2re[0]
    assert "energy" in r and abs(r.energy.item()) < 50  # y_relaxed via the default key map
