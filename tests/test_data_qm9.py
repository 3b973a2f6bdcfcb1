"""QM9 from every source, built in the test from real records (tests/data/qm9_records.csv)."""
import os
import shutil
import tarfile

import numpy as np
import pytest
import torch

from est.data import QM9, qm9_split
from est.data.qm9_formats import (
    B3LYP_ATOM_ENERGIES, HAR2EV, parse_xyz, qm9pack_data_dir, read_qm9pack_csv, write_pyg_raw,
    write_xyz_folder, write_xyz_tar,
)

DATA = os.path.join(os.path.dirname(__file__), "data", "qm9_records.csv")
INDICES = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 57, 59, 60, 62, 184, 826, 827, 50000, 100000, 133885]


@pytest.fixture(scope="module")
def records():
    return list(read_qm9pack_csv([DATA]))


@pytest.fixture()
def csv_root(tmp_path):
    root = tmp_path / "qm9pack_like"
    root.mkdir()
    shutil.copy(DATA, root / "qm9_part1.csv")
    return root


def _listing(path):
    return sorted((os.path.relpath(os.path.join(r, f), path), os.path.getsize(os.path.join(r, f)))
                  for r, _, fs in os.walk(path) for f in fs)


def test_qm9pack_csv_units_methane(csv_root, tmp_path):
    ds = QM9(csv_root, cache_dir=tmp_path / "cache", verbose=False)
    assert ds.source == "qm9pack" and len(ds) == 20
    assert ds.gdb_index.tolist() == INDICES
    s = ds[0]  # methane, gdb 1
    assert s.atomic_numbers.tolist() == [6, 1, 1, 1, 1]
    assert s.y.shape == (1, 19) and s.y.dtype == torch.float32
    y = ds.targets[0]  # float64
    assert y[7].item() == pytest.approx(-40.47893 * 27.211386246, abs=1e-9)  # U0 in eV
    assert y[7].item() == pytest.approx(-1101.4878, abs=1e-3)
    assert y[12].item() == pytest.approx(-17.1722, abs=2e-4)  # atomisation U0, PyG's value
    assert y[2].item() == pytest.approx(-0.3877 * HAR2EV)  # HOMO eV
    assert y[0].item() == 0.0 and y[1].item() == pytest.approx(13.21)  # mu (D), alpha (a0^3)
    assert y[16:].tolist() == pytest.approx([157.7118, 157.70997, 157.70699])  # A, B, C GHz
    assert y[11].item() == pytest.approx(6.469)  # cv
    # conventions: molecules carry zero cell, no pbc, zero fixed/tags
    assert torch.equal(s.cell, torch.zeros(1, 3, 3)) and s.pbc.tolist() == [[False] * 3]
    assert s.fixed.tolist() == [0] * 5 and s.tags.tolist() == [0] * 5 and int(s.natoms) == 5
    assert int(s.sid) == 1


def test_atomrefs(csv_root, tmp_path):
    ds = QM9(csv_root, cache_dir=tmp_path / "cache", verbose=False)
    y = ds.targets
    for t in (7, 8, 9, 10):
        ref = ds.atomref(t)
        assert ref.shape == (100,) and ref[1].item() == pytest.approx(B3LYP_ATOM_ENERGIES[1][t - 7] * HAR2EV)
        for i in range(len(ds)):
            z = ds[i].atomic_numbers
            assert (y[i, t] - ref[z].sum()).item() == pytest.approx(y[i, t + 5].item(), abs=1e-6)
    assert ds.atomref(0) is None
    fit = ds.atomref(7, mode="fit")
    assert torch.isfinite(fit).all() and fit[6] != 0


def test_pyg_raw_matches_qm9pack(records, csv_root, tmp_path):
    raw = tmp_path / "pyg" / "raw"
    write_pyg_raw(records, raw, uncharacterized=[57])
    ref = QM9(csv_root, cache_dir=tmp_path / "c1", verbose=False)
    before = _listing(tmp_path / "pyg")
    ds = QM9(tmp_path / "pyg", cache_dir=tmp_path / "c2", verbose=False)  # PyG root: finds raw/
    assert ds.source == "pyg" and len(ds) == 19 and 57 not in ds.gdb_index.tolist()
    keep = [i for i, g in enumerate(ref.gdb_index) if g != 57]
    a, b = ref.targets[keep], ds.targets
    np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-6, atol=1e-4)
    for j, i in enumerate(keep[:5] + keep[-2:]):
        assert torch.equal(ds[keep.index(i)].atomic_numbers, ref[i].atomic_numbers)
        assert torch.allclose(ds[keep.index(i)].pos, ref[i].pos, atol=6e-5)  # SDF keeps 4 decimals
    assert _listing(tmp_path / "pyg") == before  # nothing written into the source folder


def test_xyz_tarball_and_folder_with_mathematica_exponents(records, csv_root, tmp_path):
    tar = tmp_path / "dsgdb9nsd.xyz.tar.bz2"
    write_xyz_tar(records, tar)
    with tarfile.open(tar) as tf:
        texts = [tf.extractfile(m).read().decode() for m in tf.getmembers()]
    assert any("*^" in t for t in texts)  # the release's exponent notation is exercised
    ref = QM9(csv_root, cache_dir=tmp_path / "c0", verbose=False)
    ds = QM9(tar, cache_dir=tmp_path / "c1", verbose=False, uncharacterized=os.devnull)
    assert ds.source == "xyz" and len(ds) == 20
    np.testing.assert_allclose(ds.targets.numpy(), ref.targets.numpy(), rtol=1e-12)
    assert torch.equal(ds[5].pos, ref[5].pos)
    folder = tmp_path / "xyz"
    write_xyz_folder(records, folder)
    ds2 = QM9(folder, source="xyz", cache_dir=tmp_path / "c2", verbose=False, uncharacterized=os.devnull)
    np.testing.assert_allclose(ds2.targets.numpy(), ref.targets.numpy(), rtol=1e-12)
    # without an uncharacterized.txt, the list shipped with est applies (57, 59, 60, 62 are not in it)
    ds3 = QM9(tar, cache_dir=tmp_path / "c3", verbose=False)
    assert len(ds3) == 20


def test_parse_xyz_exponent_notation():
    text = ("3\ngdb 3\t1.2*^3\t293.6\t191.3\t1.8\t6.31\t-0.26\t0.07\t0.33\t19.0\t0.021\t-76.4\t-76.4\t-76.4\t-76.4\t6.0\t\n"
            "O\t-0.0343604951\t0.9775395708\t7.6*^-6\t-0.5\nH\t0.1\t0.2\t-1.5*^-5\t0.25\nH\t0.3\t0.4\t0.5\t0.25\n"
            "1.0\t2.0\t3.0\nO\tO\nInChI=1S/H2O/h1H2\tInChI=1S/H2O/h1H2\n")
    rec = parse_xyz(text)
    assert rec.index == 3 and rec.native[0] == 1200.0
    assert rec.pos[0, 2] == pytest.approx(7.6e-6) and rec.pos[1, 2] == pytest.approx(-1.5e-5)
    with pytest.raises(ValueError, match="bad.xyz"):
        parse_xyz("3\nnot a gdb line\n", where="bad.xyz")


def test_auto_reports_choice_and_errors(records, tmp_path, capsys):
    write_pyg_raw(records[:3], tmp_path / "r")
    ds = QM9(tmp_path / "r", cache_dir=tmp_path / "c")
    assert "using source 'pyg'" in capsys.readouterr().err and ds.source == "pyg"
    with pytest.raises(FileNotFoundError, match="no QM9 source"):
        QM9(tmp_path / "r", source="xyz", cache_dir=tmp_path / "c", verbose=False)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        QM9(tmp_path / "missing", verbose=False)


def test_cache_reused_atomic_and_outside_source(records, tmp_path, monkeypatch):
    raw = tmp_path / "src"
    write_pyg_raw(records, raw)
    os.chmod(raw, 0o555)  # a read-only source folder
    try:
        cache = tmp_path / "cache"
        ds = QM9(raw, cache_dir=cache, verbose=False)
        assert ds.cache_path and os.path.isfile(ds.cache_path)
        assert os.path.dirname(os.path.dirname(ds.cache_path)) == str(cache)
        assert not [f for f in os.listdir(os.path.dirname(ds.cache_path)) if f.startswith(".tmp")]
        monkeypatch.setattr(QM9, "_process", lambda self, exclude: (_ for _ in ()).throw(AssertionError("reprocessed")))
        again = QM9(raw, cache_dir=cache, verbose=False)
        assert again.cache_path == ds.cache_path and torch.equal(again[3].pos, ds[3].pos)
        # options are part of the key: another exclusion list -> another cache file
        unc = tmp_path / "unc.txt"
        unc.write_text("header\n     5\n")
        monkeypatch.undo()
        other = QM9(raw, cache_dir=cache, uncharacterized=unc, verbose=False)
        assert other.cache_path != ds.cache_path and len(other) == 19
        # env var picks the cache folder; a cache inside the source folder is refused
        monkeypatch.setenv("EST_CACHE_DIR", str(tmp_path / "envcache"))
        assert QM9(raw, verbose=False).cache_path.startswith(str(tmp_path / "envcache"))
        with pytest.raises(ValueError, match="inside the QM9 source folder"):
            QM9(raw, cache_dir=raw / "cache", verbose=False)
        assert sorted(os.listdir(raw)) == ["gdb9.sdf", "gdb9.sdf.csv", "uncharacterized.txt"]
    finally:
        os.chmod(raw, 0o755)


def test_standard_split_and_subset():
    n = 130_831
    a, b = qm9_split(n, seed=0), qm9_split(n, seed=0)
    assert [len(a[k]) for k in ("train", "val", "test")] == [110_000, 10_000, 10_831]
    for k in a:
        assert np.array_equal(a[k], b[k])
    allidx = np.concatenate([a["train"], a["val"], a["test"]])
    assert len(np.unique(allidx)) == n
    assert not np.array_equal(qm9_split(n, seed=1)["train"], a["train"])


def test_subset_proportions_deterministic(csv_root, tmp_path):
    full = {s: QM9(csv_root, split=s, cache_dir=tmp_path / "c", verbose=False) for s in ("train", "val", "test")}
    sizes = {s: len(d) for s, d in full.items()}
    assert sum(sizes.values()) == 20 and sizes["train"] == round(20 * 110000 / 130831)
    sub = {s: QM9(csv_root, split=s, subset=10, cache_dir=tmp_path / "c", verbose=False) for s in full}
    assert sum(len(d) for d in sub.values()) <= 11 and len(sub["train"]) == round(sizes["train"] * 10 / 20)
    for s in full:  # nested prefixes of the same permutation
        assert np.array_equal(sub[s].indices, full[s].indices[: len(sub[s])])
    again = QM9(csv_root, split="train", subset=10, cache_dir=tmp_path / "c", verbose=False)
    assert np.array_equal(again.indices, sub["train"].indices)
    gidx = [set(d.gdb_index.tolist()) for d in full.values()]
    assert not (gidx[0] & gidx[1]) and not (gidx[0] & gidx[2]) and not (gidx[1] & gidx[2])
    half = QM9(csv_root, split="train", subset=0.5, cache_dir=tmp_path / "c", verbose=False)
    assert len(half) == round(sizes["train"] * 0.5)


@pytest.mark.skipif(qm9pack_data_dir() is None, reason="qm9pack not installed (pip install .[qm9])")
def test_real_qm9pack_files():
    import glob

    files = sorted(glob.glob(os.path.join(qm9pack_data_dir(), "qm9_part*.csv")))
    from est.data.qm9_formats import QM9PACK_PARTS

    assert len(files) == 3
    # count rows cheaply: one line per molecule; each file is one part of QM9PACK_PARTS (first/last index, count)
    n = 0
    for f, (name, lo, hi, count) in zip(files, QM9PACK_PARTS):
        with open(f, "rb") as fh:
            lines = fh.read().splitlines()
        assert os.path.basename(f) == name and len(lines) - 1 == count
        assert lines[1].split(b",")[1] == str(lo).encode() and lines[-1].split(b",")[1] == str(hi).encode()
        n += count
    assert n == 130_831  # 133,885 minus the 3,054 uncharacterised
    first = next(read_qm9pack_csv(files[:1]))
    assert first.index == 1 and first.z.tolist() == [6, 1, 1, 1, 1]
    assert first.native[10] == -40.47893


@pytest.mark.slow
@pytest.mark.skipif(qm9pack_data_dir() is None, reason="qm9pack not installed (pip install .[qm9])")
def test_real_qm9pack_full_load(tmp_path):
    from est.data.qm9_formats import shipped_uncharacterized

    ds = QM9(cache_dir=tmp_path, split="train", verbose=False)
    assert ds.source == "qm9pack" and len(ds) == 110_000
    assert len(ds._index) == 130_831
    assert not (set(ds._index.tolist()) & shipped_uncharacterized())
    assert int(ds.natoms.max()) == 29
