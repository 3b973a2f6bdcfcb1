"""OC20-layout LMDB: our writer, fairchem-style pickles (PyG 1.x and 2.x), safety, corruption."""
import hashlib
import os
import pickle

import lmdb
import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from est.data import (
    CorruptRecordError, DataFileError, LmdbDataset, UnsafePickleError, make_sample, write_lmdb,
)
from est.data.arrays import MAGIC


def _samples(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        k = 3 + i % 5
        out.append(make_sample(
            pos=torch.randn(k, 3, generator=g), atomic_numbers=torch.randint(1, 80, (k,), generator=g),
            cell=torch.eye(3) * 9.0, pbc=torch.tensor([True, True, False]),
            fixed=torch.tensor([1] + [0] * (k - 1)), tags=torch.tensor([0] + [1] * (k - 2) + [2]),
            energy=float(i) - 0.5, forces=torch.randn(k, 3, generator=g), sid=100 + i, fid=i % 3,
        ))
    return out


def _snapshot(path):
    out = {}
    for root, _, files in os.walk(path) if os.path.isdir(path) else [(os.path.dirname(path), None, [os.path.basename(path)])]:
        for f in files:
            p = os.path.join(root, f)
            out[p] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


def _write_raw(path, records, length=None, extra=None):
    env = lmdb.open(str(path), subdir=False, map_size=1 << 28)
    with env.begin(write=True) as txn:
        for i, r in enumerate(records):
            txn.put(str(i).encode(), r)
        if length is not None:
            txn.put(b"length", pickle.dumps(length))
        for k, v in (extra or {}).items():
            txn.put(k, v)
    env.close()
    lock = str(path) + "-lock"
    if os.path.exists(lock):
        os.remove(lock)


def test_round_trip_folder_and_file(tmp_path):
    samples = _samples(23)
    folder = tmp_path / "s2ef"
    assert write_lmdb(folder, samples, samples_per_shard=10) == 23
    assert sorted(os.listdir(folder)) == ["data.0000.lmdb", "data.0001.lmdb", "data.0002.lmdb", "metadata.npz"]
    ds = LmdbDataset(folder)
    assert len(ds) == 23 and ds.lengths == [10, 10, 3]
    np.testing.assert_array_equal(ds.natoms, [s.pos.shape[0] for s in samples])
    np.testing.assert_array_equal(np.load(folder / "metadata.npz")["natoms"], ds.natoms)
    for i in (0, 9, 10, 22):
        a, b = samples[i], ds[i]
        for key in ("pos", "atomic_numbers", "cell", "pbc", "fixed", "tags", "energy", "forces", "sid", "fid", "natoms"):
            assert torch.equal(a[key], b[key]), key
            assert a[key].dtype == b[key].dtype, key
        assert int(b.idx) == i
    # single-file (IS2RE layout)
    f = tmp_path / "is2re" / "data.lmdb"
    write_lmdb(f, samples[:4])
    assert os.path.isfile(f) and not os.path.exists(str(f) + "-lock")
    assert len(LmdbDataset(f)) == 4


def test_writer_stores_no_pickles_and_refuses_overwrite(tmp_path):
    f = tmp_path / "x.lmdb"
    write_lmdb(f, _samples(3))
    env = lmdb.open(str(f), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        for k, v in txn.cursor():
            if k.isdigit() or k == b"natoms":
                assert bytes(v[:4]) == MAGIC
    env.close()
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_lmdb(f, _samples(2))
    assert len(LmdbDataset(f)) == 3
    write_lmdb(f, _samples(2), overwrite=True)
    assert len(LmdbDataset(f)) == 2


def test_fairchem_pyg2_pickles_and_key_names(tmp_path):
    folder = tmp_path / "fc"
    folder.mkdir()
    recs = []
    for i in range(4):
        d = Data(pos=torch.randn(5, 3), atomic_numbers=torch.tensor([29.0, 29.0, 8.0, 6.0, 1.0]), natoms=5,
                 cell=torch.eye(3).view(1, 3, 3) * 7, tags=torch.tensor([0, 1, 2, 2, 2]),
                 fixed=torch.tensor([1, 0, 0, 0, 0]), y=-1.25 + i, force=torch.randn(5, 3), sid=77, fid=i)
        recs.append(d)
    _write_raw(folder / "data.0000.lmdb", [pickle.dumps(r, protocol=pickle.HIGHEST_PROTOCOL) for r in recs[:2]], 2)
    _write_raw(folder / "data.0001.lmdb", [pickle.dumps(r, protocol=pickle.HIGHEST_PROTOCOL) for r in recs[2:]], 2)
    before = _snapshot(str(folder))
    ds = LmdbDataset(folder)
    assert ds.natoms is None
    s = ds[3]
    assert s.atomic_numbers.dtype == torch.long and s.atomic_numbers.tolist() == [29, 29, 8, 6, 1]
    assert torch.allclose(s.energy, torch.tensor([1.75]))
    assert torch.equal(s.forces, recs[3].force)
    assert s.pbc.tolist() == [[True, True, True]] and int(s.sid) == 77 and int(s.fid) == 3
    assert _snapshot(str(folder)) == before  # nothing modified, no lock files


def test_legacy_pyg1_pickle(tmp_path):
    """PyG 1.x pickles reference the same class but keep fields in __dict__ (no _store)."""

    fields = dict(x=None, edge_index=None, pos=torch.randn(3, 3), atomic_numbers=torch.tensor([1.0, 8.0, 1.0]),
                  natoms=3, cell=torch.zeros(1, 3, 3), y_init=0.3, y_relaxed=-0.7, pos_relaxed=torch.randn(3, 3),
                  tags=torch.tensor([2, 2, 2]), sid=5, __num_nodes__=None)
    # what a PyG 1.x pickle of Data looks like: NEWOBJ of torch_geometric.data.data.Data, then BUILD
    # with the plain attribute dict as state
    state = pickle.dumps(fields, protocol=2)
    raw = b"\x80\x02" + b"ctorch_geometric.data.data\nData\n" + b")\x81" + state[2:-1] + b"b."
    assert b"_store" not in raw
    f = tmp_path / "data.lmdb"
    _write_raw(f, [raw], 1)
    ds = LmdbDataset(f, extra_fields=("pos_relaxed", "y_init"))
    s = ds[0]
    assert torch.allclose(s.energy, torch.tensor([-0.7]))  # y_relaxed -> energy for IS2RE
    assert torch.equal(s.pos_relaxed, fields["pos_relaxed"])
    s2 = LmdbDataset(f, key_map={"energy": "y_init"})[0]
    assert torch.allclose(s2.energy, torch.tensor([0.3]))


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo should-never-run",))


def test_unsafe_pickle_refused(tmp_path):
    f = tmp_path / "evil.lmdb"
    _write_raw(f, [pickle.dumps({"pos": _Evil()})], 1)
    ds = LmdbDataset(f)
    with pytest.raises(UnsafePickleError) as err:
        ds[0]
    msg = str(err.value)
    assert "system" in msg and "trusted=True" in msg and "evil.lmdb" in msg and "b'0'" in msg


def test_trusted_opt_out(tmp_path):
    from collections import Counter

    d = Data(pos=torch.zeros(2, 3), atomic_numbers=torch.tensor([1, 1]), energy=0.1, note=Counter("ab"))
    f = tmp_path / "t.lmdb"
    _write_raw(f, [pickle.dumps(d)], 1)
    with pytest.raises(UnsafePickleError, match="collections.Counter"):
        LmdbDataset(f)[0]
    assert LmdbDataset(f, trusted=True)[0].natoms.item() == 2


def test_corruption_errors(tmp_path):
    good = pickle.dumps(Data(pos=torch.zeros(2, 3), atomic_numbers=torch.tensor([1, 1]), y=0.0))
    # truncated record
    f = tmp_path / "trunc.lmdb"
    _write_raw(f, [good, good[: len(good) // 2]], 2)
    ds = LmdbDataset(f)
    ds[0]
    with pytest.raises(CorruptRecordError, match=r"trunc\.lmdb key b'1'"):
        ds[1]
    # our own record truncated
    g = tmp_path / "ours.lmdb"
    write_lmdb(g, _samples(2))
    env = lmdb.open(str(g), subdir=False)
    with env.begin(write=True) as txn:
        txn.put(b"1", txn.get(b"1")[:40])
    env.close()
    os.remove(str(g) + "-lock")
    with pytest.raises(CorruptRecordError, match=r"ours\.lmdb key b'1'"):
        LmdbDataset(g)[1]
    # length larger than the keys
    h = tmp_path / "short.lmdb"
    _write_raw(h, [good], 3)
    with pytest.raises(CorruptRecordError, match=r"short\.lmdb key b'2'.*missing"):
        LmdbDataset(h)[2]
    # missing length
    m = tmp_path / "nolen.lmdb"
    _write_raw(m, [good, good])
    with pytest.raises(DataFileError, match=r"nolen\.lmdb.*b'length'"):
        LmdbDataset(m)
    assert len(LmdbDataset(m, count_entries=True)) == 2
    # empty folder, wrong path, not an LMDB file
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataFileError, match="no \\*.lmdb files"):
        LmdbDataset(tmp_path / "empty")
    with pytest.raises(DataFileError, match="no such file"):
        LmdbDataset(tmp_path / "nope")
    junk = tmp_path / "junk.lmdb"
    junk.write_bytes(b"not an lmdb file at all" * 10)
    with pytest.raises(DataFileError, match="junk.lmdb"):
        LmdbDataset(junk)
    # corrupt length
    c = tmp_path / "badlen.lmdb"
    _write_raw(c, [good], None, {b"length": b"\x80\x04garbage"})
    with pytest.raises(CorruptRecordError, match=r"badlen\.lmdb: key b'length'"):
        LmdbDataset(c)


def test_reader_never_modifies(tmp_path):
    folder = tmp_path / "s"
    write_lmdb(folder, _samples(12), samples_per_shard=5)
    os.chmod(folder, 0o555)
    try:
        before = _snapshot(str(folder))
        ds = LmdbDataset(folder)
        for i in range(len(ds)):
            ds[i]
        assert _snapshot(str(folder)) == before
    finally:
        os.chmod(folder, 0o755)


def test_pyg_loader_collates(tmp_path):
    from torch_geometric.loader import DataLoader

    folder = tmp_path / "s"
    write_lmdb(folder, _samples(9))
    batch = next(iter(DataLoader(LmdbDataset(folder), batch_size=4)))
    assert batch.num_graphs == 4 and batch.natoms.shape == (4,) and batch.cell.shape == (4, 3, 3)
    assert batch.pbc.shape == (4, 3) and batch.energy.shape == (4,)


def test_worker_processes_reopen_files(tmp_path):
    """The parent has the file open; forked DataLoader workers must reopen it, not reuse it."""
    from torch_geometric.loader import DataLoader

    folder = tmp_path / "s"
    write_lmdb(folder, _samples(12), samples_per_shard=5)
    ds = LmdbDataset(folder)
    ds[0]  # parent opens the environment
    other = LmdbDataset(folder)  # a second dataset on the same files in one process
    assert torch.equal(other[3].pos, ds[3].pos)
    batches = list(DataLoader(ds, batch_size=4, num_workers=2))
    assert sum(b.num_graphs for b in batches) == 12


def test_tensor_dtypes_and_views_survive_restricted_unpickling(tmp_path):
    from est.data.safe_pickle import safe_loads

    tensors = {"f32": torch.randn(4, 3), "f64": torch.randn(2, dtype=torch.float64), "i64": torch.arange(5),
               "i32": torch.arange(3, dtype=torch.int32), "u8": torch.arange(4, dtype=torch.uint8),
               "bool": torch.tensor([True, False]), "f16": torch.randn(3).half(), "empty": torch.empty(0),
               "view": torch.randn(6, 4)[:, 1:3], "np": np.arange(6.0).reshape(2, 3)}
    out = safe_loads(pickle.dumps(tensors, protocol=pickle.HIGHEST_PROTOCOL))
    for k, v in tensors.items():
        if isinstance(v, np.ndarray):
            np.testing.assert_array_equal(out[k], v)
        else:
            assert out[k].dtype == v.dtype and torch.equal(out[k], v), k


def test_code_inside_a_tensor_blob_is_refused(tmp_path):
    """A crafted storage blob (torch.save of an object with a reduce) must not run."""
    import io

    marker = tmp_path / "ran"

    class Boom:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    buf = io.BytesIO()
    torch.save(Boom(), buf, _use_new_zipfile_serialization=False)
    payload = b"\x80\x04" + b"ctorch.storage\n_load_from_bytes\n" + pickle.dumps((buf.getvalue(),))[2:-1] + b"R."
    f = tmp_path / "blob.lmdb"
    _write_raw(f, [payload], 1)
    with pytest.raises(UnsafePickleError, match=r"blob\.lmdb key b'0'.*trusted=True"):
        LmdbDataset(f)[0]
    assert not marker.exists()
