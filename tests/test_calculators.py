"""est.calculators.ESTCalculator: units, derivatives, ASE optimisers / MD, batches, errors."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import ase  # noqa: F401  (a required dependency: an ImportError must fail, not skip)
from ase import Atoms, units  # noqa: E402
from ase.build import add_adsorbate, bulk, fcc111, molecule  # noqa: E402
from ase.calculators.calculator import PropertyNotImplementedError  # noqa: E402
from ase.constraints import FixAtoms  # noqa: E402

from est.calculators import ESTCalculator, UnsupportedStructureError  # noqa: E402
from est.models import build_model  # noqa: E402
from est.models.config import MODEL_DEFAULTS_VERSION

MICRO = dict(num_layers=1, lmax=2, mmax=2, channels=16, attn_hidden_channels=16, attn_alpha_channels=8,
             attn_value_channels=8, ffn_hidden_channels=32, edge_channels=16, num_radial=16, grid_resolution=(8, 7),
             cutoff=4.0, max_neighbors=None, use_pbc=True)
MEAN, STD = -1.5, 2.5


def _model(forces="gradient", **kw):
    torch.manual_seed(0)
    m = build_model("est-tiny", regress_forces=forces, **{**MICRO, **kw})
    with torch.no_grad():  # make the untrained energy surface less flat; x3 made the EST default's attention so
        for p in m.parameters():  # peaked (logits x9) that 6 BFGS steps of 0.05 A went uphill (measured: max |F| 1.35
            p.mul_(2.0) if p.dim() > 1 else None  # eV/A at x3, 0.04 at x2; Verlet drift 3e-7 vs 2e-9 eV/atom)
    return m.eval()


@pytest.fixture(scope="module")
def grad_model():
    return _model("gradient")


@pytest.fixture(scope="module")
def direct_model():
    return _model("direct")


def _slab(seed=1):
    s = fcc111("Cu", (2, 2, 2), vacuum=4.0)
    add_adsorbate(s, "O", 1.6, "fcc")
    s.set_constraint(FixAtoms(indices=[a.index for a in s if a.tag == 2]))
    s.rattle(0.05, seed=seed)
    return s


def _mol(name):
    # a generic orientation: edges exactly along the +-y pole give autograd forces ~0.1% off -dE/dx
    # in this checkout (a Wigner-D gradient at the pole, not the calculator)
    m = molecule(name)
    m.rotate(17, "x")
    m.rotate(33, "z")
    return m


def _bulk():
    b = bulk("Cu", "fcc", a=3.6, cubic=True)
    b.rotate(17, "x", rotate_cell=True)  # no lattice vector along the +-y pole (see _mol)
    b.rotate(33, "z", rotate_cell=True)
    b.rattle(0.03, seed=3)
    return b


def _fd_energy(atoms, calc, i, k, h=1e-4):
    a = atoms.copy()
    a.calc = calc
    a.positions[i, k] += h
    ep = a.get_potential_energy()
    a.positions[i, k] -= 2 * h
    em = a.get_potential_energy()
    return -(ep - em) / (2 * h)


def test_forces_are_minus_energy_gradient(grad_model):
    calc = ESTCalculator(model=grad_model, energy_mean=MEAN, energy_std=STD, dtype=torch.float64)
    for atoms in (_slab(), _mol("H2O")):
        atoms.calc = calc
        f = atoms.get_forces(apply_constraint=False)
        assert np.abs(f).max() > 1e-5
        for i, k in ((0, 0), (len(atoms) - 1, 2), (1, 1)):
            assert f[i, k] == pytest.approx(_fd_energy(atoms, calc, i, k), abs=1e-6 + 1e-5 * np.abs(f).max())


def test_stress_is_finite_strain_derivative(grad_model):
    calc = ESTCalculator(model=grad_model, energy_mean=MEAN, energy_std=STD, dtype=torch.float64)
    atoms = _bulk()
    atoms.calc = calc
    s = atoms.get_stress()  # Voigt xx yy zz yz xz xy, ASE sign
    assert s.shape == (6,) and np.abs(s).max() > 1e-6
    h, V = 1e-5, atoms.get_volume()
    for voigt, (i, j) in ((0, (0, 0)), (2, (2, 2)), (5, (0, 1))):
        es = []
        for sign in (1, -1):
            eps = np.zeros((3, 3))
            eps[i, j] += sign * h / (1 if i == j else 2)
            eps[j, i] += 0 if i == j else sign * h / 2
            a = atoms.copy()
            a.set_cell(atoms.cell.array @ (np.eye(3) + eps), scale_atoms=True)
            a.calc = calc
            es.append(a.get_potential_energy())
        fd = (es[0] - es[1]) / (2 * h) / V
        assert s[voigt] == pytest.approx(fd, abs=1e-8 + 1e-5 * np.abs(s).max())


def test_units_restored_from_normalizers(grad_model, direct_model):
    from torch_geometric.data import Batch

    from est.data import atoms_to_sample

    atoms = _slab()
    for model in (grad_model, direct_model):
        out = model(Batch.from_data_list([atoms_to_sample(atoms)]))
        calc = ESTCalculator(model=model, normalizers={"energy_mean": torch.tensor(MEAN, dtype=torch.float64),
                                                       "energy_std": torch.tensor(STD, dtype=torch.float64)})
        atoms.calc = calc
        assert atoms.get_potential_energy() == pytest.approx(STD * float(out["energy"]) + MEAN, rel=1e-5, abs=1e-5)
        assert atoms.get_potential_energy(force_consistent=True) == atoms.get_potential_energy()
        np.testing.assert_allclose(atoms.get_forces(apply_constraint=False), STD * out["forces"].detach().numpy(),
                                   rtol=1e-4, atol=1e-5)
        # mean does not move forces; std scales them
        other = ESTCalculator(model=model, energy_mean=MEAN + 10.0, energy_std=2 * STD)
        a2 = atoms.copy()
        a2.calc = other
        np.testing.assert_allclose(a2.get_forces(apply_constraint=False), 2 * atoms.get_forces(apply_constraint=False),
                                   rtol=1e-5, atol=1e-6)


def _checkpoint(tmp_path, model) -> str:
    """``model`` saved as an est.train checkpoint (EMA weights = the model's, raw weights zeroed)."""
    from est.train.checkpoint import save_checkpoint

    cfg = {"model": {"name": "est-tiny", "regress_forces": "gradient", **{k: (list(v) if isinstance(v, tuple) else v)
                                                                          for k, v in MICRO.items()}},
           "data": {"task": "s2ef"}}
    state = model.state_dict()
    raw = {k: torch.zeros_like(v) if v.is_floating_point() else v for k, v in state.items()}
    path = str(tmp_path / "best.pt")
    save_checkpoint({"model": raw, "ema": {"module": state, "num_updates": 1, "decay": 0.9},
                     "normalizers": {"energy_mean": torch.tensor(MEAN, dtype=torch.float64),
                                     "energy_std": torch.tensor(STD, dtype=torch.float64)},
                     "config": cfg, "step": 7, "model_defaults": MODEL_DEFAULTS_VERSION, "elements": [8, 29]}, path)
    return path


def test_from_checkpoint_restores_model_normalizers_and_elements(tmp_path, grad_model):
    path = _checkpoint(tmp_path, grad_model)
    calc = ESTCalculator.from_checkpoint(path)
    ref = ESTCalculator(model=grad_model, energy_mean=MEAN, energy_std=STD)
    atoms = _slab()
    r1 = calc.predict_batch([atoms])[0]
    r2 = ref.predict_batch([atoms])[0]
    assert r1["energy"] == pytest.approx(r2["energy"], abs=1e-5)
    np.testing.assert_allclose(r1["forces"], r2["forces"], atol=1e-5)
    assert calc.info.step == 7 and calc.elements == [8, 29]
    assert "stress" in calc.implemented_properties
    raw_calc = ESTCalculator.from_checkpoint(path, use_ema=False)  # raw (zeroed) weights differ
    assert raw_calc.predict_batch([atoms])[0]["energy"] != pytest.approx(r1["energy"], abs=1e-6)
    bad = atoms.copy()
    bad[0].symbol = "Au"
    with pytest.raises(UnsupportedStructureError, match=r"never saw Au .*trained on O Cu"):
        calc.get_potential_energy(bad)


def test_training_elements_from_the_emt_manifest(tmp_path):
    import json

    from est.calculators.ase import _training_elements

    (tmp_path / "s2ef" / "train").mkdir(parents=True)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "est OC20-layout EMT dataset",
                                                        "config": {"metals": ["Cu", "Pt"], "adsorbates": ["OH", "CO"]}}))
    cfg = {"data": {"task": "s2ef", "train_path": str(tmp_path / "s2ef" / "train")}}
    assert _training_elements({}, cfg, "s2ef") == [1, 6, 8, 29, 78]
    assert _training_elements({"elements": [8, 1]}, cfg, "s2ef") == [1, 8]
    assert _training_elements({}, {"data": {"task": "qm9"}}, "qm9") == [1, 6, 7, 8, 9]
    assert _training_elements({}, {"data": {"task": "s2ef", "train_path": "/nonexistent/s2ef/train"}}, "s2ef") is None


def test_bfgs_fire_relaxations_lower_the_energy(grad_model):
    from ase.optimize import BFGS, FIRE

    calc = ESTCalculator(model=grad_model, energy_mean=MEAN, energy_std=STD)
    for opt_cls in (BFGS, FIRE):
        atoms = _slab(seed=5)
        atoms.calc = calc
        e0 = atoms.get_potential_energy()
        fixed0 = atoms.positions[atoms.constraints[0].get_indices()].copy()
        opt = opt_cls(atoms, logfile=None, maxstep=0.05)  # small steps: an untrained model's surface is rough
        energies = []
        opt.attach(lambda: energies.append(atoms.get_potential_energy()))
        opt.run(fmax=0.01, steps=6)
        assert len(energies) == 7 and energies[-1] < e0
        np.testing.assert_array_equal(atoms.positions[atoms.constraints[0].get_indices()], fixed0)


def test_md_velocity_verlet_and_langevin(grad_model, direct_model):
    from ase.md.langevin import Langevin
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution
    from ase.md.verlet import VelocityVerlet

    def drift_per_atom(model):
        """Spread of the total energy (eV/atom) over 4 velocity-Verlet steps of 0.5 fs from 300 K, float64."""
        atoms = _slab(seed=2)
        atoms.calc = ESTCalculator(model=model, energy_mean=MEAN, energy_std=STD, dtype=torch.float64)
        MaxwellBoltzmannDistribution(atoms, temperature_K=300, rng=np.random.RandomState(0))  # noqa
        etot = []
        md = VelocityVerlet(atoms, timestep=0.5 * units.fs)
        md.attach(lambda: etot.append(atoms.get_total_energy()), interval=1)
        md.run(4)
        assert len(etot) == 5
        return float(np.ptp(etot)) / len(atoms), atoms

    # measured (9-atom slab, 2 fs): gradient forces 2.0e-9 eV/atom (5.0e-9 with the previous default) (integration error; potential energy moves
    # 1.3e-4 eV/atom), the same forces scaled by 1.01 1.3e-6, direct forces 1.1e-3. The bound sits between:
    # 20x above conservative forces, 13x below a 1% non-conservative error.
    bound = 1e-7
    drift, atoms = drift_per_atom(grad_model)
    assert drift < bound, drift  # energy-conserving forces
    assert drift_per_atom(direct_model)[0] > bound  # a direct head is not -dE/dx: this bound catches it
    atoms.calc = ESTCalculator(model=direct_model, energy_mean=MEAN, energy_std=STD)
    Langevin(atoms, 1.0 * units.fs, temperature_K=300, friction=0.02, rng=np.random.RandomState(0)).run(3)
    assert np.isfinite(atoms.positions).all()


def test_predict_batch_equals_single_calls(grad_model):
    calc = ESTCalculator(model=grad_model, energy_mean=MEAN, energy_std=STD)
    structures = [_slab(1), _mol("CH4"), _bulk(), _slab(4), _mol("H2O")]
    single = []
    for a in structures:
        a = a.copy()
        a.calc = calc
        single.append((a.get_potential_energy(), a.get_forces(apply_constraint=False)))
    batched = calc.predict_batch(structures, batch_size=2)
    assert len(batched) == len(structures)
    for (e, f), r in zip(single, batched):
        assert r["energy"] == pytest.approx(e, abs=2e-4) and r["free_energy"] == r["energy"]
        np.testing.assert_allclose(r["forces"], f, atol=2e-4)
    with_stress = calc.predict_batch([_bulk(), _slab()], properties=("energy", "forces", "stress"))
    a = _bulk()
    a.calc = calc
    np.testing.assert_allclose(with_stress[0]["stress"], a.get_stress(), atol=1e-5)


def test_float64_matches_float32(grad_model):
    atoms = _slab()
    r32 = ESTCalculator(model=grad_model, energy_mean=MEAN, energy_std=STD).predict_batch([atoms])[0]
    r64 = ESTCalculator(model=grad_model, energy_mean=MEAN, energy_std=STD,
                        dtype=torch.float64).predict_batch([atoms])[0]
    assert next(grad_model.parameters()).dtype == torch.float32  # the caller's module is not converted
    assert r64["energy"] == pytest.approx(r32["energy"], abs=1e-4)
    np.testing.assert_allclose(r64["forces"], r32["forces"], atol=1e-4)
    named = ESTCalculator(model=grad_model, energy_mean=MEAN, energy_std=STD, dtype="float64")  # as MACE's default_dtype
    assert named.dtype == torch.float64 and next(named.model.parameters()).dtype == torch.float64
    assert named.predict_batch([atoms])[0]["energy"] == r64["energy"]
    for bad in ("float16", torch.float16, "double"):
        with pytest.raises(ValueError, match=r"float32 or torch.float64 \(or 'float32' / 'float64'\), got"):
            ESTCalculator(model=grad_model, dtype=bad)


def test_energy_only_model_gets_autograd_forces_and_stress():
    model = _model(None)
    calc = ESTCalculator(model=model, energy_mean=MEAN, energy_std=STD, dtype=torch.float64)
    atoms = _bulk()
    atoms.calc = calc
    f = atoms.get_forces()
    assert f[1, 0] == pytest.approx(_fd_energy(atoms, calc, 1, 0), abs=1e-6 + 1e-5 * np.abs(f).max())
    assert atoms.get_stress().shape == (6,)


def test_errors(grad_model, direct_model):
    calc = ESTCalculator(model=grad_model)
    with pytest.raises(UnsupportedStructureError, match="empty Atoms"):
        calc.get_potential_energy(Atoms())
    a = molecule("H2O")
    a.positions[1, 0] = np.nan
    with pytest.raises(UnsupportedStructureError, match="non-finite position"):
        calc.get_potential_energy(a)
    a = molecule("H2O")
    a.positions[1] = a.positions[0] + [0.1, 0, 0]
    with pytest.raises(UnsupportedStructureError, match="0.100 A apart"):
        calc.get_potential_energy(a)
    with pytest.raises(UnsupportedStructureError, match=r"never saw Og \(Z=118\).*embeds Z=1..89"):
        calc.get_potential_energy(Atoms("Og", positions=[[0, 0, 0]]))
    with pytest.raises(UnsupportedStructureError, match="never saw Au"):
        ESTCalculator(model=grad_model, elements=[1, 6, 8]).get_potential_energy(Atoms("AuH", positions=[[0, 0, 0], [0, 0, 1.6]]))
    with pytest.raises(PropertyNotImplementedError, match="periodic"):
        calc.get_stress(molecule("H2O"))
    dcalc = ESTCalculator(model=direct_model)
    assert "stress" not in dcalc.implemented_properties
    with pytest.raises(PropertyNotImplementedError):
        dcalc.get_stress(_bulk())
    nopbc = ESTCalculator(model=_model("gradient", use_pbc=False))
    with pytest.raises(UnsupportedStructureError, match="use_pbc=False"):
        nopbc.get_potential_energy(_bulk())
    b = _bulk()
    b.cell[2] = 0.0
    with pytest.raises(UnsupportedStructureError, match="degenerate"):
        calc.get_potential_energy(b)
    with pytest.raises(ValueError, match="exactly one"):
        ESTCalculator()


def test_checkpoint_on_a_finer_design(tmp_path, grad_model):
    """``model_overrides`` re-samples the same weights on another spherical design (the EST default's
    weights act on coefficients); an override that changes the weights' shapes is refused by name."""
    path = _checkpoint(tmp_path, grad_model)
    base = ESTCalculator.from_checkpoint(path, dtype=torch.float64)
    fine = ESTCalculator.from_checkpoint(path, dtype=torch.float64, model_overrides={"est": {"grid": {"degree": 24}}})
    points = lambda c: c.model.backbone.update_blocks[0].spherical.sft.num_points  # noqa: E731
    assert (points(base), points(fine)) == (146, 314)
    atoms = _slab()
    r_base, r_fine = base.predict_batch([atoms])[0], fine.predict_batch([atoms])[0]
    # the default's bounded logits are resolved on degree 16 (measured: equal energies; block outputs 8e-15 apart)
    assert r_fine["energy"] == pytest.approx(r_base["energy"], rel=1e-12)
    uncapped = [ESTCalculator.from_checkpoint(path, dtype=torch.float64,
                                              model_overrides={"est": {"logit_cap": 0, "grid": {"degree": d}}})
                for d in (16, 24)]
    e16, e24 = (c.predict_batch([atoms])[0]["energy"] for c in uncapped)
    assert e16 != e24  # unbounded logits (sigma ~ 15 here): another quadrature of the same attention ...
    assert e16 == pytest.approx(e24, rel=1e-12)  # ... still resolved at initial weights (measured 6.6e-15)
    with pytest.raises(ValueError, match=r"model_overrides=.*change the shapes.*Fix: override only options") as err:
        ESTCalculator.from_checkpoint(path, model_overrides={"channels": 8})
    assert "pass model=" not in str(err.value)  # not the fix for a file that is no checkpoint


def test_qm9_checkpoint_total_energy_and_autograd_forces(tmp_path):
    from est.data.qm9_formats import B3LYP_ATOM_ENERGIES, HAR2EV
    from est.train.checkpoint import save_checkpoint

    kw = {k: (list(v) if isinstance(v, tuple) else v) for k, v in MICRO.items()}
    kw.update(use_pbc=False, num_targets=1, regress_energy=False, regress_forces=None)
    model = _model(None, use_pbc=False, num_targets=1, regress_energy=False)
    path = str(tmp_path / "qm9.pt")
    norm = {"mean": torch.tensor([-70.0], dtype=torch.float64), "std": torch.tensor([10.0], dtype=torch.float64),
            "ref": torch.zeros(1, 100, dtype=torch.float64), "cols": torch.tensor([12])}
    save_checkpoint({"model": model.state_dict(), "ema": None, "normalizers": norm, "step": 1,
                     "model_defaults": MODEL_DEFAULTS_VERSION,
                     "config": {"model": {"name": "est-tiny", **kw}, "data": {"task": "qm9", "targets": [7], "atomref": "b3lyp"}}},
                    path)
    calc = ESTCalculator.from_checkpoint(path, dtype=torch.float64)
    assert calc.elements == [1, 6, 7, 8, 9] and "stress" in calc.implemented_properties
    mol = _mol("CH3OH")
    p = float(model.double()(_double_batch(mol))["properties"][0, 0])
    ref = sum(B3LYP_ATOM_ENERGIES[int(z)][0] * HAR2EV for z in mol.numbers)
    mol.calc = calc
    assert mol.get_potential_energy() == pytest.approx(10.0 * p - 70.0 + ref, abs=1e-6)
    f = mol.get_forces()
    assert f[0, 1] == pytest.approx(_fd_energy(mol, calc, 0, 1), abs=1e-5 + 1e-5 * np.abs(f).max())
    with pytest.raises(UnsupportedStructureError, match="never saw Cl"):
        calc.get_potential_energy(_mol("CH3Cl"))


def _double_batch(atoms):
    from torch_geometric.data import Batch

    from est.data import atoms_to_sample

    b = Batch.from_data_list([atoms_to_sample(atoms)])
    b.pos = torch.as_tensor(atoms.positions, dtype=torch.float64)
    b.cell = b.cell.double()
    return b
