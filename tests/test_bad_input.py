"""Model-level hardening (issue 13): structures without edges, and bad input with clear errors.

Edgeless structures (a single atom, atoms all beyond the cutoff) are everyday
inputs (isolated-atom energies, the far end of a dissociation curve). Their
energy is the model's energy of the edgeless graph: every message is empty, so
each atom contributes the energy of its own embedding, the forces are exactly
zero and a bond stretched to the cutoff approaches it continuously (the
polynomial envelope). All in float64.
"""
import warnings

import pytest
import torch
from torch_geometric.data import Batch, Data

import est.data
import est.geometry
import est.models
from est.models import MODEL_CONFIGS, build_model

F64 = torch.float64
CUTOFF = 5.0  # the tiny presets' cutoff
UPDATE_PRESETS = {"ffn": "eqv2-tiny", "est": "est-tiny", "spherical": "spherical-tiny"}


@pytest.fixture(autouse=True)
def _single_thread():
    """Tiny tensors: one intra-op thread (more only add contention on a shared machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny(update: str, **overrides):
    """A small float64 model of one update kind (fast on CPU)."""
    overrides = dict(dict(num_layers=1, envelope="polynomial"), **overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gradient forces without max_neighbors=None warn; irrelevant here
        return build_model(UPDATE_PRESETS[update], **overrides).double().eval()


def sample(pos, z, **fields) -> Data:
    return Data(pos=torch.as_tensor(pos, dtype=F64).view(-1, 3), atomic_numbers=torch.tensor(z), **fields)


def at_distance(r: float) -> Data:
    """C and O with the bond along a generic direction."""
    u = torch.tensor([0.3, 0.4, 0.866], dtype=F64)
    return sample(torch.stack([torch.zeros(3, dtype=F64), r * u / u.norm()]), [6, 8])


# --------------------------------------------------------------------------- edgeless structures
@pytest.mark.parametrize("update", sorted(UPDATE_PRESETS))
@pytest.mark.parametrize("forces", ["direct", "gradient"])
def test_edgeless_structures_give_the_isolated_energy_and_zero_forces(update, forces):
    torch.manual_seed(0)
    model = tiny(update, regress_forces=forces)
    e_c, e_o = (model(sample([[0.0, 0.0, 0.0]], [z])) for z in (6, 8))
    for out in (e_c, e_o):
        assert torch.isfinite(out["energy"]).all()
        assert torch.equal(out["forces"], torch.zeros(1, 3, dtype=F64))
    isolated = e_c["energy"] + e_o["energy"]

    # beyond the cutoff: no edges, the energy is the sum of the isolated atoms' (energy_reduce="sum")
    far = model(at_distance(CUTOFF + 0.5))
    assert torch.equal(far["forces"], torch.zeros(2, 3, dtype=F64))
    assert (far["energy"] - isolated).abs().item() < 1e-15  # measured <= 3e-17 (round-off)

    # just inside the cutoff the curve meets it continuously (envelope: u, u', u'' vanish at r_c)
    near = model(at_distance(CUTOFF * (1 - 2e-4)))
    assert (near["energy"] - isolated).abs().item() < 2e-11  # measured <= 2.1e-12 (all kinds, both force modes)
    assert near["forces"].abs().max().item() < 6e-8  # measured <= 5.4e-9

    # a batch mixing graphs with and without edges: each graph as if alone
    bonded = at_distance(1.2)
    alone = model(bonded)
    mixed = model(Batch.from_data_list([sample([[0.0, 0.0, 0.0]], [6]), bonded, sample([[1.0, 2.0, 3.0]], [8])]))
    expected = torch.cat([e_c["energy"], alone["energy"], e_o["energy"]])
    assert (mixed["energy"] - expected).abs().max().item() < 1e-14  # measured <= 3e-17
    assert (mixed["forces"][1:3] - alone["forces"]).abs().max().item() < 1e-14
    assert torch.equal(mixed["forces"][[0, 3]], torch.zeros(2, 3, dtype=F64))


@pytest.mark.parametrize("update", sorted(UPDATE_PRESETS))
def test_edgeless_periodic_cell_has_zero_forces_and_stress_and_trains(update):
    torch.manual_seed(0)
    model = tiny(update, regress_forces="gradient", regress_stress=True)
    cell = 20.0 * torch.eye(3, dtype=F64)[None]  # images 20 A apart: beyond the 5 A cutoff
    crystal = sample([[1.0, 2.0, 3.0]], [6], cell=cell, pbc=torch.ones(1, 3, dtype=torch.bool))
    molecule = sample([[1.0, 2.0, 3.0]], [6], cell=torch.zeros(1, 3, 3, dtype=F64), pbc=torch.zeros(1, 3, dtype=torch.bool))
    out = model(Batch.from_data_list([crystal]))
    assert torch.equal(out["forces"], torch.zeros(1, 3, dtype=F64))
    assert torch.equal(out["stress"], torch.zeros(1, 3, 3, dtype=F64))
    assert (out["energy"] - model(molecule)["energy"]).abs().item() < 1e-15  # same atom, no neighbours either way

    model.train()  # training: create_graph=True through an edgeless graph, then a parameter gradient
    out = model(Batch.from_data_list([crystal, molecule]))
    loss = out["energy"].square().sum() + out["forces"].square().sum() + out["stress"].square().sum()
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


# --------------------------------------------------------------------------- bad input, clear errors
@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return tiny("est")


def water(**fields) -> Data:
    return sample([[0.0, 0.0, 0.0], [0.96, 0.0, 0.0], [-0.24, 0.93, 0.0]], [8, 1, 1], **fields)


def test_dtype_mismatch_names_both_dtypes_and_the_cast(model):
    d = water()
    d.pos = d.pos.float()
    with pytest.raises(TypeError, match=r"torch.float32 but the model's weights are torch.float64.*model.float\(\)"):
        model(d)


def test_missing_atomic_numbers(model):
    d = water()
    del d.atomic_numbers
    with pytest.raises(ValueError, match="no atomic_numbers; every sample needs"):
        model(d)
    d.z = torch.tensor([8, 1, 1])
    with pytest.raises(ValueError, match=r"set data.atomic_numbers = data.z"):
        model(d)


def test_float_atomic_numbers_integral_accepted_fractional_refused(model):
    ref = model(water())["energy"]
    d = water()
    d.atomic_numbers = d.atomic_numbers.double()  # OC20 LMDBs store Z as float
    assert torch.equal(model(d)["energy"], ref)
    d.atomic_numbers = torch.tensor([8.0, 1.4, 1.0])
    with pytest.raises(ValueError, match=r"non-integer value 1.4 at atom 1.*pass a long tensor"):
        model(d)


def test_pbc_without_a_cell_is_refused(model):
    with pytest.raises(ValueError, match="pbc is True but the batch has no cell"):
        model(water(pbc=torch.ones(1, 3, dtype=torch.bool)))
    cell = torch.diag(torch.tensor([10.0, 10.0, 0.0], dtype=F64))[None]
    with pytest.raises(ValueError, match="periodic along lattice vector 2.*cell row is zero"):
        model(water(pbc=torch.ones(1, 3, dtype=torch.bool), cell=cell))
    slab = water(pbc=torch.tensor([[True, True, False]]), cell=cell)  # 2-D periodic with no c vector: fine
    assert torch.isfinite(model(slab)["energy"]).all()


@pytest.mark.parametrize("batch, match", [([0, -1, 0], "negative"), ([0, 0, 10**12], "only 3 atoms")])
def test_bad_graph_index(model, batch, match):
    with pytest.raises(ValueError, match=match):
        model(water(batch=torch.tensor(batch)))


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(num_layers=0), "num_layers must be an integer >= 1"),
        (dict(num_layers=-2), "num_layers must be an integer >= 1"),
        (dict(channels=0), "channels must be an integer >= 1"),
        (dict(channels=-1), "channels must be an integer >= 1"),
        (dict(max_num_elements=0), r"max_num_elements must be an integer >= 2.*1 \+ the largest Z"),
        (dict(max_num_elements=1), r"max_num_elements must be an integer >= 2"),
        (dict(cutoff=0.0), "cutoff must be > 0"),
    ],
)
def test_bad_model_config(overrides, match):
    with pytest.raises(ValueError, match=match):
        build_model("est-tiny", **overrides)


# --------------------------------------------------------------------------- the promised API
def test_list_models_and_radius_graph_reexport():
    names = est.models.list_models()
    assert names == sorted(MODEL_CONFIGS) and {"est-tiny", "eqv2-tiny", "est-paper", "equiformer_v2-31m"} <= set(names)
    assert est.data.radius_graph is est.geometry.radius_graph  # the promised est.data API
    g = est.data.radius_graph(torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [9.0, 0.0, 0.0]]), 2.0)
    assert sorted(g.edge_index.T.tolist()) == [[0, 1], [1, 0]]


def test_layers_and_models_import_no_data_io():
    """Layering: est.nn and est.models look only down (geometry, sphere, so3), never at data I/O."""
    import subprocess
    import sys

    code = "import sys, est.nn, est.models; print(sorted(m for m in ('lmdb', 'est.data', 'est.train') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", out
