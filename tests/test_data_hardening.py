"""Bad and damaged data files: a clear error (or warning) naming the file and the fix, never a crash.

Truncated LMDB files are read in a forked child: a regression would kill the
child with SIGBUS, not the test process.
"""
import csv
import multiprocessing as mp
import os
import pickle
import signal
import warnings

import lmdb
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from torch_geometric.data import Data

from est.data import DataFileError, LmdbDataset, QM9, make_sample, write_lmdb
from est.data.lmdb_io import LmdbWriter, check_lmdb_file
from est.data.qm9_formats import QM9PACK_PARTS, qm9_gaps, read_qm9pack_csv, shipped_uncharacterized
from est.data.sample import NonFiniteInputError

QM9_CSV = os.path.join(os.path.dirname(__file__), "data", "qm9_records.csv")
KNOWN = np.setdiff1d(np.arange(1, 133_886), np.fromiter(shipped_uncharacterized(), dtype=np.int64))  # 130,831


def _samples(n, k=20):
    g = torch.Generator().manual_seed(0)
    return [make_sample(pos=torch.randn(k, 3, generator=g), atomic_numbers=torch.randint(1, 80, (k,), generator=g),
                        energy=float(i), forces=torch.randn(k, 3, generator=g), sid=500 + i) for i in range(n)]


def _truncate(path, keep):
    with open(path, "r+b") as fh:
        fh.truncate(keep)


def _load_all(path, conn):
    """Child: open and read every sample; report how it ended."""
    try:
        ds = LmdbDataset(path)
        for i in range(len(ds)):
            ds[i]
        conn.send(("ok", len(ds)))
    except Exception as exc:  # the child reports, the parent asserts
        conn.send((type(exc).__name__, str(exc)))


def _in_child(path):
    """(exit code, report) of :func:`_load_all` run in a forked process."""
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_load_all, args=(str(path), send))
    p.start()
    p.join(60)
    return p.exitcode, (recv.recv() if recv.poll() else None)


def test_truncated_lmdb_file_and_shard_refused_without_sigbus(tmp_path):
    f = tmp_path / "is2re" / "data.lmdb"
    write_lmdb(f, _samples(150))
    full = os.path.getsize(f)
    assert check_lmdb_file(str(f)) == full  # our writer's files are exactly as long as their header says
    _truncate(f, full // 2)  # an interrupted copy
    code, report = _in_child(f)
    assert code == 0, f"reader died with signal {-code} ({signal.Signals(-code).name})" if code and code < 0 else code
    kind, msg = report
    assert kind == "DataFileError"
    assert str(f) in msg and "truncated LMDB file" in msg and f"{full:,} bytes" in msg and "copy the file again" in msg
    # a folder with one cut shard is refused when the dataset is built
    folder = tmp_path / "s2ef"
    write_lmdb(folder, _samples(150), samples_per_shard=60)
    shard = folder / "data.0001.lmdb"
    _truncate(shard, os.path.getsize(shard) - 4096)  # one page short
    code, (kind, msg) = _in_child(folder)
    assert code == 0 and kind == "DataFileError" and "data.0001.lmdb: truncated" in msg


def test_lmdb_size_comes_from_the_newest_meta_page(tmp_path):
    """Two transactions: the older meta page needs far fewer pages; a file cut between the two is refused."""
    f = str(tmp_path / "two.lmdb")
    env = lmdb.open(f, subdir=False, map_size=1 << 26, lock=False)
    with env.begin(write=True) as txn:
        txn.put(b"a", b"x")
    with env.begin(write=True) as txn:
        for i in range(300):
            txn.put(str(i).encode(), os.urandom(2000))
    env.close()
    full = os.path.getsize(f)
    assert check_lmdb_file(f) == full and full > 100 * 4096
    _truncate(f, 8 * 4096)  # enough for the first transaction's pages, not the second's
    with pytest.raises(DataFileError, match=r"two\.lmdb: truncated LMDB file: 32,768 bytes.*transaction 2"):
        check_lmdb_file(f)
    _truncate(f, 100)  # not even one meta page
    with pytest.raises(DataFileError, match=r"two\.lmdb: not an LMDB file \(100 bytes"):
        LmdbDataset(f)


def test_empty_file_and_lmdb_environment_folder(tmp_path):
    empty = tmp_path / "empty.lmdb"
    empty.write_bytes(b"")
    with pytest.raises(DataFileError, match=r"empty\.lmdb: not an LMDB file \(0 bytes"):
        LmdbDataset(empty)
    envdir = tmp_path / "env"
    e = lmdb.open(str(envdir), map_size=1 << 20)  # subdir layout: env/data.mdb
    with e.begin(write=True) as txn:
        txn.put(b"length", pickle.dumps(0))
    e.close()
    with pytest.raises(DataFileError, match=r"data\.mdb \(an LMDB environment folder\): pass the file .*data\.mdb"):
        LmdbDataset(envdir)
    assert len(LmdbDataset(envdir / "data.mdb")) == 0


def test_truncated_aselmdb_refused(tmp_path):
    from est.data import AseDbDataset

    f = tmp_path / "set.aselmdb"
    write_lmdb(f.with_suffix(".lmdb"), _samples(60))
    os.replace(f.with_suffix(".lmdb"), f)
    _truncate(f, os.path.getsize(f) // 2)
    with pytest.raises(DataFileError, match=r"set\.aselmdb: truncated LMDB file"):
        AseDbDataset(f)  # refused before any backend maps it


def _raw_lmdb(path, records):
    env = lmdb.open(str(path), subdir=False, map_size=1 << 24, lock=False)
    with env.begin(write=True) as txn:
        for i, r in enumerate(records):
            txn.put(str(i).encode(), pickle.dumps(r, protocol=4))
        txn.put(b"length", pickle.dumps(len(records)))
    env.close()


def test_nonfinite_positions_and_cell_name_file_key_and_ids(tmp_path):
    pos = torch.randn(5, 3)
    bad_pos = pos.clone()
    bad_pos[4, 1] = float("nan")
    cell = torch.eye(3).view(1, 3, 3) * 8.0
    bad_cell = cell.clone()
    bad_cell[0, 2, 2] = float("inf")
    z = torch.tensor([29.0, 29.0, 8.0, 6.0, 1.0])
    recs = [Data(pos=pos, atomic_numbers=z, cell=cell, y=0.5, sid=70 + i) for i in range(3)]
    recs[1].pos = bad_pos
    recs[2].cell = bad_cell
    f = tmp_path / "fc.lmdb"
    _raw_lmdb(f, recs)
    ds = LmdbDataset(f)
    ds[0]
    with pytest.raises(NonFiniteInputError, match=r"fc\.lmdb key b'1': sample \(idx 1, sid 71\): non-finite pos .* atom 4"):
        ds[1]
    with pytest.raises(NonFiniteInputError, match=r"fc\.lmdb key b'2': sample \(idx 2, sid 72\): non-finite cell"):
        ds[2]
    # through a DataLoader worker the error keeps its type (what a trainer catches to skip the batch)
    loader = DataLoader(ds, batch_size=None, sampler=[1], num_workers=1,
                        multiprocessing_context=mp.get_context("fork"))
    with pytest.raises(NonFiniteInputError, match=r"fc\.lmdb key b'1'.*sid 71"):
        next(iter(loader))
    # the trainer reads with check_finite=False and checks whole batches itself (max_bad_batches)
    kept = LmdbDataset(f, check_finite=False)
    assert torch.isnan(kept[1].pos).any() and torch.isinf(kept[2].cell).any()


def test_finite_samples_leaves_out_bad_inputs_with_one_warning(tmp_path):
    from est.data.sample import finite_samples

    recs = [Data(pos=torch.randn(3, 3), atomic_numbers=torch.tensor([1, 1, 8]), y=0.0, sid=i) for i in range(4)]
    recs[2].pos[0, 0] = float("inf")
    f = tmp_path / "stats.lmdb"
    _raw_lmdb(f, recs)
    with pytest.warns(UserWarning, match=r"1 of 4 samples left out .*stats\.lmdb key b'2': sample \(idx 2, sid 2\)"):
        got = list(finite_samples(LmdbDataset(f), range(4)))
    assert [int(s.sid) for s in got] == [0, 1, 3]


def test_atomic_numbers_missing_nonintegral_or_nan(tmp_path):
    with pytest.raises(ValueError, match=r"atomic_numbers\[1\] = 6.4 is not a whole number"):
        make_sample(pos=np.zeros((2, 3)), atomic_numbers=[1.0, 6.4])
    with pytest.raises(NonFiniteInputError, match=r"atomic_numbers\[0\] = nan"):
        make_sample(pos=np.zeros((2, 3)), atomic_numbers=[float("nan"), 6.0])
    assert make_sample(pos=np.zeros((2, 3)), atomic_numbers=np.array([1.0, 6.0000001])).atomic_numbers.tolist() == [1, 6]
    # a record without atomic_numbers in a file: named, with the key_map fix
    f = tmp_path / "noz.lmdb"
    _raw_lmdb(f, [Data(pos=torch.zeros(2, 3), y=0.0)])
    with pytest.raises(ValueError, match=r"noz\.lmdb key b'0': record has no 'atomic_numbers'.*key_map"):
        LmdbDataset(f)[0]


def test_writer_refuses_what_the_reader_would_refuse(tmp_path):
    path = tmp_path / "w.lmdb"
    good = _samples(2)
    nan = _samples(1)[0]
    nan.pos[3, 0] = float("nan")
    with pytest.raises(ValueError, match=r"w\.lmdb: sample 2 \(to write\) has no 'atomic_numbers'"):
        write_lmdb(path, good + [{"pos": np.zeros((2, 3)), "energy": 1.0}])
    with pytest.raises(NonFiniteInputError, match=r"w\.lmdb: sample 1 \(to write\).*non-finite pos .*atom 3"):
        write_lmdb(path, [good[0], nan])
    assert not path.exists() and not list(tmp_path.iterdir())  # nothing half-written is left behind
    with LmdbWriter(path) as w:
        w.add({"pos": np.zeros((2, 3)), "z": np.array([1, 1])})  # the alternative key name is accepted
    assert LmdbDataset(path)[0].atomic_numbers.tolist() == [1, 1]


def test_ase_db_nan_position_names_row(tmp_path):
    import ase.db
    from ase import Atoms

    from est.data import AseDbDataset

    path = tmp_path / "nan.db"
    db = ase.db.connect(str(path))
    db.write(Atoms("H2", positions=[[0, 0, 0], [0, 0, 0.74]]))
    db.write(Atoms("H2", positions=[[0, 0, 0], [np.nan, 0, 0.74]]), sid=9)
    ds = AseDbDataset(path)
    ds[0]
    with pytest.raises(NonFiniteInputError, match=r"nan\.db row id 2: sample \(idx 1, sid 9\): non-finite pos .*atom 1"):
        ds[1]
    with pytest.raises(IsADirectoryError, match="pass an ASE database file"):
        AseDbDataset(tmp_path)


# ----------------------------------------------------------------------------- QM9


def _qm9pack_folder(root, parts):
    """qm9pack-style CSVs whose Index column holds the first ``n`` known indices from ``lo`` ({name: (lo, n)})."""
    with open(QM9_CSV, newline="") as fh:
        rows = list(csv.reader(fh))
    header, body = rows[0], rows[1:]
    col = header.index("Index")
    root.mkdir()
    for name, (lo, n) in parts.items():
        with open(root / name, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(header)
            for k, index in enumerate(KNOWN[KNOWN >= lo][:n]):
                row = list(body[k % len(body)])
                row[col] = str(index)
                w.writerow(row)
    return root


def test_qm9_gaps_on_full_index_sets():
    assert qm9_gaps(KNOWN, []) == []
    no_part2 = KNOWN[(KNOWN < QM9PACK_PARTS[1][1]) | (KNOWN > QM9PACK_PARTS[1][2])]
    assert qm9_gaps(no_part2, ["/d/qm9_part1.csv", "/d/qm9_part3.csv"]) == [
        "qm9pack's qm9_part2.csv is missing (gdb 44747-89008, 43,611 molecules)"]
    cut = qm9_gaps(KNOWN[:-1000], ["/d/qm9_part1.csv", "/d/qm9_part2.csv", "/d/qm9_part3.csv"])
    assert cut == [f"/d/qm9_part3.csv: 42,610 of 43,610 molecules (gdb 89009-{KNOWN[-1001]}; it ends at 133885): cut short"]
    records = [r.index for r in read_qm9pack_csv([QM9_CSV])]  # a hand-made selection: no complaint
    assert qm9_gaps(np.asarray(records), ["/d/qm9_part1.csv"]) == []


def test_qm9_cut_and_missing_parts_warn_with_files_and_counts(tmp_path):
    root = _qm9pack_folder(tmp_path / "cut", {"qm9_part1.csv": (1, 120), "qm9_part3.csv": (89_009, 150)})
    with pytest.warns(UserWarning) as rec:
        ds = QM9(root, cache_dir=tmp_path / "c", verbose=False)
    msg = " ".join(str(w.message) for w in rec)
    assert len(ds) == 270
    assert "270 molecules loaded, QM9 has 130,831" in msg
    assert f"{root / 'qm9_part1.csv'}: 120 of 43,610 molecules" in msg and "cut short" in msg
    assert "qm9_part2.csv is missing (gdb 44747-89008, 43,611 molecules)" in msg
    with pytest.warns(UserWarning, match="qm9_part2.csv is missing"):
        QM9(root, cache_dir=tmp_path / "c", verbose=False)  # again from the cache
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        QM9(QM9_CSV, cache_dir=False, verbose=False)  # a hand-made selection loads quietly


def test_qm9_partly_extracted_xyz_folder_warns(tmp_path):
    from dataclasses import replace

    from est.data.qm9_formats import write_xyz_folder

    recs = list(read_qm9pack_csv([QM9_CSV]))
    write_xyz_folder([replace(recs[k % len(recs)], index=int(i)) for k, i in enumerate(KNOWN[:130])], tmp_path / "xyz")
    with pytest.warns(UserWarning, match=r"the QM9 release: 130 of 130,831 molecules \(gdb 1-\d+; it ends at 133885\): cut"):
        QM9(tmp_path / "xyz", cache_dir=False, verbose=False)


def test_installed_qm9pack_damaged_is_an_error(tmp_path, monkeypatch):
    root = _qm9pack_folder(tmp_path / "site", {"qm9_part1.csv": (1, 100), "qm9_part2.csv": (44_747, 100)})
    monkeypatch.setattr("est.data.qm9.qm9pack_data_dir", lambda: str(root))
    with pytest.raises(ValueError, match=r"qm9_part3.csv is missing.*pip install --force-reinstall --no-deps qm9pack"):
        QM9(cache_dir=False, verbose=False)


def test_qm9_csv_binary_garbage_and_cut_row(tmp_path):
    data = open(QM9_CSV, "rb").read()
    lines = data.split(b"\n")
    bad = tmp_path / "garbage.csv"
    bad.write_bytes(b"\n".join(lines[:5] + [b"\x00\xff\xfe\x9c binary \x80" + lines[5]] + lines[6:]))
    with pytest.raises(ValueError, match=r"garbage\.csv, line 6: not text .*copy it again"):
        QM9(bad, cache_dir=False, verbose=False)
    cut = tmp_path / "cut.csv"
    cut.write_bytes(data[: len(data) - 200])  # inside the last row
    with pytest.raises(ValueError, match=r"cut\.csv, line 21: malformed qm9pack row .*last line: the file was cut short"):
        QM9(cut, cache_dir=False, verbose=False)


def test_qm9_nan_position_names_source_and_molecule(tmp_path):
    with open(QM9_CSV, newline="") as fh:
        rows = list(csv.reader(fh))
    col = rows[0].index("XYZ_Ang")
    atoms = rows[3][col].strip("[]").split("],[")  # "[[x,y,z],[x,y,z],...]"
    atoms[0] = ",".join(["nan"] + atoms[0].split(",")[1:])
    rows[3][col] = "[[" + "],[".join(atoms) + "]]"
    f = tmp_path / "nanpos.csv"
    with open(f, "w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    ds = QM9(f, cache_dir=False, verbose=False)
    gdb = int(rows[3][rows[0].index("Index")])
    i = int(np.nonzero(ds.gdb_index == gdb)[0][0])
    with pytest.raises(NonFiniteInputError, match=rf"nanpos\.csv gdb {gdb}: sample \(idx {i}, sid {gdb}\).*atom 0"):
        ds[i]
