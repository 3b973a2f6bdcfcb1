"""est.testing.check_model: whole models on molecules and periodic cells, planted defects caught."""
import ase
import pytest
import torch
from torch_geometric.data import Data

from est.testing import BatchModelAdapter, CallableAdapter, as_system, check_model
from est.testing._reps import single_thread
from est.testing.toy_models import MorsePotential, e3nn_potential, example_crystal, example_molecule, morse_callable

pytestmark = pytest.mark.equivariance
F64 = torch.float64
FAST = dict(num_rotations=4, refine_steps=4)  # periodic graphs are the slow part


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: intra-op threads only add wake-up latency on a busy 2-core box."""
    with single_thread():
        yield


def failing(report):
    return {(r.check, r.output) for r in report.failures()}


def failing_checks(report):
    return {r.check for r in report.failures()}


# --------------------------------------------------------------------------- correct models pass
def test_molecule_all_checks_pass_in_float64():
    report = check_model(MorsePotential().double(), example_molecule(6), parity=True)
    report.assert_ok()
    assert set(report.checks) == {"repeat", "rotation", "reflection", "translation", "permutation"}
    assert report.max_rel() < 1e-12
    assert report.row("rotation", "forces").component == "l=1"


def test_periodic_cell_all_checks_pass_with_stress():
    report = check_model(MorsePotential(cutoff=3.0).double(), example_crystal(), **FAST)
    report.assert_ok()
    assert {"cell_rotation", "lattice_shift", "supercell_2x1x1", "supercell_1x2x1", "supercell_1x1x2"} <= set(report.checks)
    # stress is checked as a rank-2 tensor, degree by degree
    assert {r.component for r in report.rows if r.output == "stress" and r.check == "cell_rotation"} == {"l=0", "l=1", "l=2"}
    assert report.row("supercell_2x1x1", "energy").scale > 0  # compared with 2 E
    assert "properties" not in {r.output for r in report.rows if r.check.startswith("supercell")}  # unknown extensivity


def test_slab_supercells_only_along_periodic_axes():
    report = check_model(MorsePotential(cutoff=3.0).double(), example_crystal(pbc=(True, True, False)), checks=["supercell", "lattice_shift"])
    report.assert_ok()
    assert set(report.checks) == {"lattice_shift", "supercell_2x1x1", "supercell_1x2x1"}


def test_float32_model_does_not_falsely_fail():
    model = MorsePotential(cutoff=3.0)  # float32 parameters, checked in its own dtype with float32 tolerances
    check_model(model, example_molecule(8), dtype="model").assert_ok()
    report = check_model(model, example_crystal(), dtype=torch.float32, **FAST)
    report.assert_ok()
    assert report.dtype == torch.float32 and report.max_rel() > 1e-9  # real rounding, inside 1e-4


def test_float64_by_default_on_a_cast_copy():
    """Documented and done: checks run in float64 on a copy; the caller's float32 model is untouched."""
    model = MorsePotential(cutoff=3.0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = check_model(model, example_molecule(6), checks=["rotation"])
    report.assert_ok()
    assert report.dtype == F64 and report.max_rel() < 1e-12  # float32 rounding would be ~1e-7
    assert all(v.dtype == torch.float32 and torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert CallableAdapter(morse_callable(cutoff=3.0)).dtype == F64


def test_function_in_another_dtype_gets_a_hint():
    w = torch.ones(3, 3)  # float32 weights inside a plain function: it cannot be cast

    def fn(positions, numbers, cell, pbc):
        return {"energy": (positions @ w).pow(2).sum()}

    with pytest.raises(RuntimeError, match=r"dtype=torch\.float32"):
        check_model(fn, example_molecule(4), checks=["rotation"])
    check_model(fn, example_molecule(4), checks=["translation"], dtype=torch.float32)  # runs


# --------------------------------------------------------------------------- est's own models
# rotation errors of tiny float64 est models seen through check_model (6-atom molecule, 4 Haar
# rotations + the 14 special ones + 4 search steps; 3 inits): est-tiny 1.1e-7, eqv2-tiny 1.1e-5 relative;
# 4-atom crystal (cell_rotation): 1.2e-7, 3.2e-6. Translations, permutations, lattice shifts and
# supercells are exact to 6e-15 (the float64 default 1e-10 applies). Update block alone on random
# lmax = 3 features (5 nodes, 32 channels): 6.7e-4 (EST), 2.0e-3 (update="ffn").
EST_MODEL_TOL = {"est-tiny": (1e-6, 7e-3), "eqv2-tiny": (1e-4, 2e-2)}  # (model rotation, update block)


@pytest.mark.parametrize("name", list(EST_MODEL_TOL))
def test_est_models_pass_check_model_and_their_update_block_assert_equivariant(name):
    from est.models import build_model
    from est.testing import assert_equivariant

    model = build_model(name, regress_forces="direct")  # float32, as users build it
    model_tol, block_tol = EST_MODEL_TOL[name]
    report = check_model(model, example_molecule(6), checks=["repeat", "rotation", "translation", "permutation"],
                         num_rotations=2, refine_steps=2, num_translations=1, num_permutations=1)
    assert report.dtype == F64 and next(model.parameters()).dtype == torch.float32
    report.assert_ok(tol={"rotation": model_tol})
    assert report.max_rel("rotation") > 1e-12  # the grids' aliasing is measured, not hidden
    block = model.backbone.update_blocks[0]
    assert_equivariant(block, lmax=3, channels=32, num_nodes=5, num_rotations=4, refine_steps=4, tol=block_tol)


def test_est_model_on_a_crystal_and_per_module_profile():
    from est.models import build_model
    from est.testing import check_modules

    model = build_model("est-tiny", regress_forces="direct")
    report = check_model(model, example_crystal(), checks=["cell_rotation", "lattice_shift", "supercell"],
                         num_rotations=1, refine_steps=0, num_shifts=1)
    report.assert_ok(tol={"cell_rotation": EST_MODEL_TOL["est-tiny"][0]})
    assert {"lattice_shift", "supercell_2x1x1", "supercell_1x1x2"} <= set(report.checks)
    profile = check_modules(model, example_molecule(5), num_rotations=1)  # hooks on the float64 copy
    assert profile.dtype == F64 and any(m.startswith("backbone.update_blocks.0") for m in profile.meta["modules"])


def test_callable_adapter_e3nn_model_is_o3_equivariant():
    fn = e3nn_potential(cutoff=3.0)
    report = check_model(fn, example_molecule(6), parity=True)  # dipole is a vector output
    report.assert_ok()
    assert report.row("rotation", "dipole").component == "l=1"
    check_model(fn, example_crystal(), parity=True, num_rotations=2, refine_steps=0).assert_ok()


def test_callable_adapter_and_sample_formats():
    fn = morse_callable(cutoff=3.0)
    mol = example_molecule(5)
    atoms = ase.Atoms(numbers=mol["atomic_numbers"].numpy(), positions=mol["pos"].numpy())
    r1 = check_model(fn, atoms, checks=["rotation", "permutation"])
    r2 = check_model(CallableAdapter(fn, dtype=F64), (mol["pos"], mol["atomic_numbers"]), checks=["rotation", "permutation"])
    r1.assert_ok(), r2.assert_ok()
    crystal = example_crystal()
    data = Data(pos=crystal["pos"].float(), atomic_numbers=crystal["atomic_numbers"], cell=crystal["cell"][None].float(),
                pbc=crystal["pbc"][None], tags=torch.tensor([0, 1, 1, 2]), fixed=torch.tensor([1, 0, 0, 0]))
    system = as_system(data)
    assert system.periodic and system.atom_fields["tags"].tolist() == [0, 1, 1, 2]
    assert as_system(system.permuted(torch.tensor([3, 2, 1, 0]))).atom_fields["fixed"].tolist() == [0, 0, 0, 1]
    batch = BatchModelAdapter(MorsePotential().double()).batch(system)
    assert batch.cell.shape == (1, 3, 3) and batch.pbc.shape == (1, 3) and batch.pos.dtype == F64


def test_output_types_override_vector_property():
    def model(positions, numbers, cell, pbc):
        centred = positions - positions.mean(0)
        q = numbers.to(positions.dtype) - numbers.to(positions.dtype).mean()
        return {"energy": (centred ** 2).sum(), "properties": (q[:, None] * centred).sum(0)}  # a dipole [3]

    # default: "properties" is invariant, so the check (rightly) fails ...
    assert ("rotation", "properties") in failing(check_model(model, example_molecule(5), checks=["rotation"]))
    # ... declared as an l = 1 vector it passes
    check_model(model, example_molecule(5), output_types={"properties": "vector"}, parity=True).assert_ok()


# --------------------------------------------------------------------------- planted defects
def test_model_reading_absolute_coordinates():
    report = check_model(MorsePotential(defect="absolute_position").double(), example_molecule(6))
    assert {"translation", "rotation"} <= failing_checks(report)
    assert "permutation" not in failing_checks(report)
    with pytest.raises(AssertionError, match=r"translation: output 'energy' l=0: max abs error .* worst transform: translation by"):
        report.assert_ok()


def test_symmetry_break_of_1e_minus_4_in_float64():
    model = MorsePotential(defect="symmetry_break").double()
    report = check_model(model, example_molecule(6))
    assert failing_checks(report) == {"rotation"}  # translation-invariant: the break is in the edge vectors
    assert 1e-7 < report.max_rel("rotation") < 1e-2
    report.assert_ok(tol={"rotation": 1e-2})  # a stated bound makes it pass
    with pytest.raises(AssertionError, match="worst transform: rotation about axis"):
        report.assert_ok()


def test_permutation_dependent_readout():
    report = check_model(MorsePotential(defect="permutation").double(), example_molecule(6))
    assert failing_checks(report) == {"permutation"}
    with pytest.raises(AssertionError, match="permutation: output 'energy'.*worst transform: atom permutation"):
        report.assert_ok()


def test_periodic_model_without_images_fails_lattice_and_supercell_checks():
    report = check_model(MorsePotential(defect="no_images", cutoff=3.0).double(), example_crystal(), **FAST)
    bad = failing_checks(report)
    assert "lattice_shift" in bad and "supercell_2x1x1" in bad
    assert "cell_rotation" not in bad and "permutation" not in bad


def test_reflection_is_reported_separately():
    report = check_model(MorsePotential(defect="chiral").double(), example_molecule(6))
    report.assert_ok()  # SE(3) models need not be O(3)
    refl = report.row("reflection", "energy")
    assert not refl.expected and not refl.ok and "info: broken" in report.table()
    with pytest.raises(AssertionError, match="reflection: output 'energy'"):
        check_model(MorsePotential(defect="chiral").double(), example_molecule(6), parity=True).assert_ok()


# --------------------------------------------------------------------------- report API
def test_report_table_dict_json():
    report = check_model(MorsePotential().double(), example_molecule(4), checks=["rotation", "translation"])
    text = str(report)
    for word in ("check", "max abs", "mean abs", "max rel", "mean rel", "rotation", "forces", "overall: ok"):
        assert word in text
    d = report.to_dict()
    assert d["ok"] and d["dtype"] == "float64" and d["meta"]["num_atoms"] == 4
    assert {"check", "output", "component", "max_abs", "mean_abs", "max_rel", "mean_rel", "ok", "worst"} <= set(d["rows"][0])
    assert '"rows"' in report.to_json()


def test_errors_name_the_fix():
    with pytest.raises(ValueError, match="atomic numbers"):
        check_model(MorsePotential(), {"pos": torch.zeros(2, 3)})
    with pytest.raises(TypeError, match="fn\\(positions, numbers, cell, pbc\\)"):
        check_model(lambda a, b: {}, example_molecule(3))
    with pytest.raises(ValueError, match="unknown checks"):
        check_model(MorsePotential(), example_molecule(3), checks=["rotaton"])
    with pytest.raises(ValueError, match="no cell"):
        check_model(MorsePotential(), {"pos": torch.zeros(2, 3), "numbers": [1, 1], "pbc": [True, True, True]})


# --------------------------------------------------------------------------- per-module profile
class _ToyNet(torch.nn.Module):
    """Node features from edge harmonics, then a degree-wise linear, optionally a y-axis-only block."""

    def __init__(self, broken: bool):
        super().__init__()
        from est.so3 import rotation_y, wigner_D

        self.lmax = 2
        self.embed = _Embed(self.lmax)
        self.mix = _DegreeLinear(self.lmax, 4)
        self.broken = broken
        self.register_buffer("Dy", wigner_D(2, rotation_y(torch.tensor([0.9], dtype=F64)))[0])
        self.tail = _DegreeLinear(self.lmax, 4)

    def forward(self, positions, numbers, cell, pbc):
        e = self.embed(positions)  # [n, 9, 4]
        h = self.mix(e)
        if self.broken:
            h = torch.einsum("ij,njc->nic", self.Dy, h)
        h = self.tail(h)
        return {"energy": (h * e).sum()}  # invariant iff h rotates like e


class _Embed(torch.nn.Module):
    def __init__(self, lmax):
        super().__init__()
        self.lmax = lmax

    def forward(self, pos):
        from est.so3 import spherical_harmonics

        vec = pos[None, :, :] - pos[:, None, :]  # [n, n, 3]
        mask = ~torch.eye(pos.shape[0], dtype=torch.bool)
        y = spherical_harmonics(self.lmax, vec[mask], normalize=True).reshape(pos.shape[0], -1, (self.lmax + 1) ** 2)
        w = torch.exp(-vec[mask].norm(dim=-1)).reshape(pos.shape[0], -1, 1)
        h = (y * w).sum(1)  # [n, K]
        return torch.stack([h, 2 * h, h * h[:, :1], -h], dim=-1)  # [n, K, 4]


class _DegreeLinear(torch.nn.Module):
    def __init__(self, lmax, c):
        super().__init__()
        from est.so3 import degree_index

        self.w = torch.nn.Parameter(torch.randn(lmax + 1, c, c, dtype=F64))
        self.register_buffer("idx", degree_index(lmax))

    def forward(self, x):
        return torch.einsum("nkc,kcd->nkd", x, self.w[self.idx])


def test_check_modules_locates_the_broken_block():
    from est.testing import check_modules

    good = check_modules(_ToyNet(broken=False), example_molecule(5))
    good.assert_ok()
    assert good.meta["modules"] == ["embed", "mix", "tail"]  # in execution order
    bad = check_modules(_ToyNet(broken=True), example_molecule(5))
    first = bad.failures()[0]
    assert (first.output, first.component) == ("tail", "l=1")  # embed and mix are fine, the error enters before tail
    assert bad.row("rotation", "mix", "l=2").ok and bad.row("rotation", "embed", "l=1").ok
    # the end-to-end check agrees that something is wrong
    assert not check_model(_ToyNet(broken=True), example_molecule(5), checks=["rotation"]).ok


def test_default_dtype_is_restored_even_when_the_block_raises():
    from est.testing import default_dtype

    before = torch.get_default_dtype()
    with default_dtype(torch.float64) as dt:
        assert dt is torch.float64 and torch.zeros(1).dtype == torch.float64
    assert torch.get_default_dtype() == before
    with pytest.raises(RuntimeError, match="boom"):
        with default_dtype(torch.float64):
            raise RuntimeError("boom")
    assert torch.get_default_dtype() == before
