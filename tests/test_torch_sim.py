"""est.calculators.torch_sim.ESTTorchSimModel: same energies / forces / stress as ESTCalculator on batches of
different structures, torch-sim's own interface check, a short NVE run, unseen elements refused."""
import sys

import numpy as np
import pytest
import torch

if sys.version_info < (3, 11):  # torch-sim-atomistic needs Python >= 3.11 (the dev extra installs it from there)
    pytest.skip("torch-sim-atomistic requires Python >= 3.11", allow_module_level=True)

import torch_sim as ts  # noqa: E402  (in the dev extra: an ImportError must fail, not skip)
from torch_sim.models.interface import validate_model_outputs  # noqa: E402

from est.calculators import ESTCalculator, UnsupportedStructureError  # noqa: E402
from est.calculators.torch_sim import ESTTorchSimModel  # noqa: E402
from est.train.checkpoint import save_checkpoint  # noqa: E402
from est.models.config import MODEL_DEFAULTS_VERSION

from test_calculators import MEAN, MICRO, STD, _bulk, _model, _mol, _slab  # noqa: E402

ELEMENTS = [1, 6, 7, 8, 29]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """An S2EF checkpoint in est.train's format: gradient forces, normalisers and fitted references."""
    model = _model("gradient")
    ref = torch.full((119,), float("nan"), dtype=torch.float64)
    ref[ELEMENTS] = torch.tensor([-3.1, -8.0, -6.2, -4.9, -1.7], dtype=torch.float64)
    norm = {"energy_mean": torch.tensor(MEAN, dtype=torch.float64), "energy_std": torch.tensor(STD, dtype=torch.float64),
            "atomref": ref}
    kw = {k: (list(v) if isinstance(v, tuple) else v) for k, v in MICRO.items()}
    path = str(tmp_path_factory.mktemp("ts") / "best.pt")
    save_checkpoint({"model": model.state_dict(), "ema": None, "normalizers": norm, "step": 1, "elements": ELEMENTS,
                     "model_defaults": MODEL_DEFAULTS_VERSION,
                     "elements_source": "test", "config": {"model": {"name": "est-tiny", "regress_forces": "gradient", **kw},
                                                           "data": {"task": "s2ef", "atomref": "fit"}}}, path)
    return path


def _compare(atoms_list, ts_model, calc, *, stress, atol):
    state = ts.io.atoms_to_state(atoms_list, ts_model.device, ts_model.dtype)
    positions, cell = state.positions.clone(), state.cell.clone()
    out = ts_model(state)
    assert torch.equal(state.positions, positions) and torch.equal(state.cell, cell)  # input untouched
    assert all(not v.requires_grad and v.dtype == ts_model.dtype for v in out.values())
    want = calc.predict_batch(atoms_list, properties=("energy", "forces", "stress") if stress else ("energy", "forces"))
    assert out["energy"].shape == (len(atoms_list),) and out["forces"].shape == (state.n_atoms, 3)
    assert np.allclose(out["energy"].double().numpy(), [w["energy"] for w in want], rtol=0, atol=atol)
    assert np.allclose(out["forces"].double().numpy(), np.concatenate([w["forces"] for w in want]), rtol=0, atol=atol)
    if stress:
        xx, yy, zz, yz, xz, xy = np.stack([w["stress"] for w in want]).T
        full = np.stack([xx, xy, xz, xy, yy, yz, xz, yz, zz], axis=1).reshape(-1, 3, 3)
        assert np.allclose(out["stress"].double().numpy(), full, rtol=0, atol=atol)
    else:
        assert "stress" not in out


@pytest.mark.parametrize("dtype,atol", [(torch.float64, 1e-9), (torch.float32, 2e-4), ("float32", 2e-4)])
def test_same_results_as_the_ase_calculator(checkpoint, dtype, atol):
    ts_model = ESTTorchSimModel(checkpoint, device="cpu", dtype=dtype)  # a name, as MACE's default_dtype, works too
    calc = ESTCalculator(checkpoint, dtype=dtype)
    assert ts_model.dtype == calc.dtype and isinstance(ts_model.dtype, torch.dtype)
    assert ts_model.compute_stress and ts_model.compute_forces
    if dtype == torch.float64:  # molecules: total energies, references included
        _compare([_mol("H2O"), _mol("CH4"), _mol("NH3")], ts_model, calc, stress=False, atol=atol)
    slabs = [_slab(1), _slab(2)]
    for a in slabs:  # torch-sim has one pbc flag for all systems: the slabs' vacuum direction periodic too
        a.pbc = True
    _compare([slabs[0], _bulk(), slabs[1]], ts_model, calc, stress=True, atol=atol)


def test_unseen_elements_and_bad_states_are_refused(checkpoint):
    ts_model = ESTTorchSimModel(checkpoint, device="cpu")
    state = ts.io.atoms_to_state([_mol("H2O"), _mol("CH3Cl")], "cpu", torch.float64)
    with pytest.raises(UnsupportedStructureError, match=r"never saw Cl \(Z=17\)"):
        ts_model(state)
    state = ts.io.atoms_to_state([_mol("H2O")], "cpu", torch.float64)
    state.positions[0, 0] = float("nan")
    with pytest.raises(UnsupportedStructureError, match="non-finite position"):
        ts_model(state)
    with pytest.raises(ValueError, match="direct head"):
        ESTTorchSimModel(model=_model("direct"), energy_mean=MEAN, energy_std=STD, device="cpu", compute_stress=True)
    assert not ESTTorchSimModel(model=_model("direct"), device="cpu").compute_stress


def test_torch_sim_interface_check():
    # torch-sim's own check (Si and Fe, batched == single, no input mutation): a bare model embeds every element
    model = ESTTorchSimModel(model=_model("gradient"), energy_mean=MEAN, energy_std=STD, device="cpu",
                             dtype=torch.float64)
    validate_model_outputs(model, torch.device("cpu"), torch.float64)


def test_short_nve_run_of_a_batch(checkpoint):
    ts_model = ESTTorchSimModel(checkpoint, device="cpu", dtype=torch.float64)
    molecules = [_mol("H2O"), _mol("CH4"), _mol("NH3")]
    start = ts.io.atoms_to_state(molecules, "cpu", torch.float64)
    units = ts.units.MetalUnits  # time: ps, temperature: K, in torch-sim's internal units
    init_fn, update_fn = ts.nve(model=ts_model, dt=torch.tensor(0.0005 * units.time, dtype=torch.float64),
                                kT=torch.tensor(300.0 * units.temperature, dtype=torch.float64), seed=0)
    state = init_fn(start)

    def total(s):
        return s.energy + ts.calc_kinetic_energy(masses=s.masses, momenta=s.momenta, system_idx=s.system_idx)

    e0 = total(state)
    for _ in range(2):  # 2 steps of 0.5 fs
        state = update_fn(state)
    e1 = total(state)
    assert state.n_systems == 3 and torch.isfinite(state.positions).all()
    assert (state.positions - start.positions).abs().max() > 1e-5  # the atoms moved
    assert torch.allclose(e1, e0, atol=2e-3)  # velocity Verlet conserves the total energy
