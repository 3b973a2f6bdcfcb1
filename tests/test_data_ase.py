"""ASE databases read as the same sample type; the file is never modified."""
import hashlib

import numpy as np
import pytest
import torch


def _make_db(path):
    import ase.db
    from ase.build import add_adsorbate, fcc100
    from ase.calculators.emt import EMT
    from ase.constraints import FixAtoms

    db = ase.db.connect(str(path))
    atoms_list = []
    for i, ads in enumerate(["O", "H", "N"]):
        slab = fcc100("Cu", size=(2, 2, 3), vacuum=6.0)
        add_adsorbate(slab, ads, 1.6, "hollow")
        tags = np.array([0] * 4 + [1] * 8 + [2])
        slab.set_tags(tags)
        slab.set_constraint(FixAtoms(mask=tags == 0))
        slab.calc = EMT()
        slab.get_forces()
        db.write(slab, sid=40 + i, fid=i)
        atoms_list.append(slab)
    plain = fcc100("Cu", size=(1, 1, 2), vacuum=5.0)
    db.write(plain)  # no calculator: no energy/forces
    return atoms_list


@pytest.mark.parametrize("suffix", [".db", ".json"])
def test_ase_db_round_trip(tmp_path, suffix):
    from est.data import AseDbDataset

    path = tmp_path / f"set{suffix}"
    atoms_list = _make_db(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    ds = AseDbDataset(path)
    assert len(ds) == 4 and ds.natoms.tolist() == [13, 13, 13, 2]
    s = ds[0]
    a = atoms_list[0]
    assert torch.allclose(s.pos, torch.tensor(a.positions, dtype=torch.float32))
    assert s.atomic_numbers.tolist() == a.numbers.tolist()
    assert s.tags.tolist() == a.get_tags().tolist()
    assert s.fixed.tolist() == [1] * 4 + [0] * 9
    assert s.energy.item() == pytest.approx(a.get_potential_energy(), abs=1e-5)
    assert torch.allclose(s.forces, torch.tensor(a.get_forces(apply_constraint=False), dtype=torch.float32), atol=1e-5)
    assert s.pbc.tolist() == [[True, True, False]] and int(s.sid) == 40 and int(s.fid) == 0
    last = ds[3]
    assert "energy" not in last and "forces" not in last and last.fixed.sum() == 0
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_ase_db_errors(tmp_path):
    from est.data import AseDbDataset

    with pytest.raises(FileNotFoundError, match="nope.db"):
        AseDbDataset(tmp_path / "nope.db")
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not sqlite" * 20)
    with pytest.raises(ValueError, match="bad.db"):
        AseDbDataset(bad)
