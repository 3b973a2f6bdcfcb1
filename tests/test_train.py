"""est.train units: LR shape, AdamW groups, EMA, sampler, checkpoints, tasks (loss scaling, metrics), configs."""
import math
import os
import random

import numpy as np
import pytest
import torch
from torch import nn
from torch_geometric.data import Batch

from est.train.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from est.train.config import ConfigError, load_config
from est.train.ema import EMA
from est.train.optim import CosineWarmup, param_groups
from est.train.sampler import GlobalBatchSampler
from est.train.tasks import IS2RETask, QM9Task, S2EFTask

from test_train_helpers import emt_samples


# ----------------------------------------------------------------------------- optimisation
def test_lr_shape_equiformer_v2():
    f = CosineWarmup(warmup_steps=10, total_steps=100, warmup_factor=0.2, lr_min_factor=0.01)
    assert f(0) == pytest.approx(0.2)
    assert f(5) == pytest.approx(0.6)
    assert f(10) == pytest.approx(1.0)
    assert f(11) == pytest.approx(0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * 11 / 100)))
    assert f(100) == f(250) == pytest.approx(0.01)
    vals = [f(s) for s in range(10, 101)]
    assert all(a >= b for a, b in zip(vals, vals[1:]))
    g = CosineWarmup(warmup_steps=0, total_steps=4)
    assert g(0) == pytest.approx(1.0)


def test_no_weight_decay_on_biases_and_norms():
    m = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 2))
    m.register_parameter("norm_scale", nn.Parameter(torch.ones(2, 2)))
    decay, no_decay = param_groups(m, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    ids = {id(p) for p in decay["params"]}
    assert ids == {id(m[0].weight), id(m[2].weight)}
    assert len(no_decay["params"]) == 5  # 2 biases, LayerNorm weight + bias, norm_scale


def test_ema_warmup_and_state():
    m = nn.Linear(2, 1)
    ema = EMA(m, decay=0.999)
    with torch.no_grad():
        m.weight.add_(1.0)
    ema.update(m)  # d = min(0.999, 2/11)
    d = 2.0 / 11.0
    expected = d * (m.weight - 1.0) + (1 - d) * m.weight
    assert torch.allclose(ema.module.weight, expected)
    st = ema.state_dict()
    e2 = EMA(nn.Linear(2, 1), decay=0.999)
    e2.load_state_dict(st)
    assert e2.num_updates == 1 and torch.equal(e2.module.weight, ema.module.weight)


# ----------------------------------------------------------------------------- sampler
def test_sampler_resume_and_split():
    natoms = np.random.RandomState(0).randint(5, 80, size=103)
    full = GlobalBatchSampler(103, global_batch_size=8, shuffle=True, seed=3)
    full.set_epoch(2)
    batches = list(full)
    assert len(batches) == full.num_batches() == 13
    part = GlobalBatchSampler(103, global_batch_size=8, shuffle=True, seed=3)
    part.load_state_dict({"epoch": 2, "position": 5, "seed": 3})
    assert list(part) == batches[5:]
    # ranks: disjoint, cover the global batch, nearly equal atoms
    ranks = [GlobalBatchSampler(103, global_batch_size=8, rank=r, world_size=2, natoms=natoms, seed=3) for r in range(2)]
    for s in ranks:
        s.set_epoch(2)
    for g, a, b in zip(batches, *[list(s) for s in ranks]):
        assert sorted(a + b) == sorted(g) and a and b
        assert abs(natoms[a].sum() - natoms[b].sum()) <= natoms[g].max()
    # evaluation: every sample exactly once over ranks, even if a rank's share is empty
    ev = [GlobalBatchSampler(5, global_batch_size=4, rank=r, world_size=3, shuffle=False, train=False) for r in range(3)]
    seen = sorted(i for s in ev for b in s for i in b)
    assert seen == list(range(5))


# ----------------------------------------------------------------------------- checkpoints
def test_checkpoint_atomic_weights_only_and_rng(tmp_path):
    path = str(tmp_path / "ck.pt")
    torch.manual_seed(1); np.random.seed(1); random.seed(1)
    state = {"model": nn.Linear(2, 2).state_dict(), "rng": [rng_state()], "config": {"a": [1, 2], "b": None}}
    a = (torch.rand(3), np.random.rand(), random.random())
    save_checkpoint(state, path)
    assert os.listdir(tmp_path) == ["ck.pt"]  # no temporary file left
    ck = load_checkpoint(path)
    set_rng_state(ck["rng"][0])
    b = (torch.rand(3), np.random.rand(), random.random())
    assert torch.equal(a[0], b[0]) and a[1] == b[1] and a[2] == b[2]
    assert ck["config"] == {"a": [1, 2], "b": None}
    # something that is not tensors/plain types is refused by weights_only loading
    import argparse

    torch.save({"f": argparse.Namespace(a=1)}, str(tmp_path / "bad.pt"))
    with pytest.raises(RuntimeError, match="weights_only"):
        load_checkpoint(str(tmp_path / "bad.pt"))


# ----------------------------------------------------------------------------- tasks
def _s2ef_task():
    t = S2EFTask(energy_coefficient=2.0, force_coefficient=100.0)
    t.norm = {"energy_mean": torch.tensor(-1.0, dtype=torch.float64), "energy_std": torch.tensor(2.0, dtype=torch.float64)}
    return t


def test_s2ef_loss_is_global_mean_for_any_split():
    """Sum of per-rank scaled losses / world == loss of the global batch (reference.md DDP scaling)."""
    task = _s2ef_task()
    samples = emt_samples(6)
    whole = Batch.from_data_list(samples)
    torch.manual_seed(0)
    e = torch.randn(6)
    f = torch.randn(whole.num_nodes, 3)
    out = {"energy": e, "forces": f}
    ref = task.loss(out, whole, task.local_counts(whole), 1)
    parts = [[0], [1, 2, 3, 4, 5]]  # very unequal atoms and free atoms
    glob = sum(task.local_counts(Batch.from_data_list([samples[i] for i in p])) for p in parts)
    total = 0.0
    for p in parts:
        b = Batch.from_data_list([samples[i] for i in p])
        mask = torch.isin(whole.batch, torch.tensor(p))
        total = total + task.loss({"energy": e[p], "forces": f[mask]}, b, glob, 2)
    assert torch.allclose(total / 2, ref, rtol=1e-5)
    # the formula itself
    free = whole.fixed == 0
    e_t = (whole.energy + 1.0) / 2.0
    f_t = whole.forces / 2.0
    by_hand = 2.0 * (e - e_t).abs().mean() + 100.0 * (f - f_t)[free].norm(dim=-1).mean()
    assert torch.allclose(ref, by_hand, rtol=1e-5)


def test_s2ef_metrics_by_hand():
    task = _s2ef_task()
    samples = emt_samples(3)
    b = Batch.from_data_list(samples)
    free = b.fixed == 0
    e_pred_ev = b.energy + torch.tensor([0.01, 0.5, -0.015])
    f_pred_ev = b.forces.clone()
    f_pred_ev[b.batch == 2] += 0.05  # system 2 fails the force threshold
    out = {"energy": (e_pred_ev + 1.0) / 2.0, "forces": f_pred_ev / 2.0}
    sums = {}
    task.accumulate(sums, out, b)
    m = task.finalize({k: float(v) for k, v in sums.items()})
    assert m["energy_mae"] == pytest.approx((0.01 + 0.5 + 0.015) / 3, rel=1e-4)
    n_free_2 = int((free & (b.batch == 2)).sum())
    assert m["forces_mae"] == pytest.approx(0.05 * 3 * n_free_2 / (3 * int(free.sum())), rel=1e-3)
    assert m["efwt"] == pytest.approx(1 / 3)  # only system 0: |dE| < 0.02 and forces exact
    cos = torch.nn.functional.cosine_similarity(f_pred_ev[free].double(), b.forces[free].double(), dim=-1).mean()
    assert m["forces_cos"] == pytest.approx(float(cos), rel=1e-6)
    assert m["base_forces_cos"] == 0.0 and m["base_energy_mae"] == pytest.approx(float((b.energy + 1).abs().mean()), rel=1e-5)


def test_is2re_metrics():
    t = IS2RETask()
    t.norm = {"energy_mean": torch.tensor(0.0, dtype=torch.float64), "energy_std": torch.tensor(1.0, dtype=torch.float64)}
    b = Batch.from_data_list(emt_samples(4))
    sums = {}
    t.accumulate(sums, {"energy": b.energy + torch.tensor([0.0, 0.01, 0.1, -0.03])}, b)
    m = t.finalize({k: float(v) for k, v in sums.items()})
    assert m["energy_mae"] == pytest.approx(0.14 / 4, rel=1e-4) and m["energy_ewt"] == pytest.approx(0.5)


def test_qm9_atomref_columns_and_mev():
    task = QM9Task(targets=[7, 4, 0], atomref="b3lyp")
    assert task.columns() == [12, 4, 0]
    assert task.units == {"mae_U0": "meV", "mae_gap": "meV", "mae_mu": "D", "mae_norm": "", "loss": ""}
    assert QM9Task(targets=[7], atomref="none").columns() == [7]


# ----------------------------------------------------------------------------- configs
@pytest.mark.parametrize("exp", ["qm9", "qm9_quick", "oc20_s2ef_quick", "oc20_is2re_quick"])
def test_experiments_compose_and_accept_overrides(exp, tmp_path):
    cfg = load_config([f"+experiment={exp}", "trainer.max_epochs=2", "trainer.max_steps=7", "data.subset=100",
                       f"run_dir={tmp_path}"], check=False)
    assert cfg.trainer.max_epochs == 2 and cfg.trainer.max_steps == 7 and cfg.data.subset == 100
    assert cfg.run_dir == str(tmp_path) and cfg.model.name


def test_oc20_recipes(tmp_path):
    s2ef = load_config(["+experiment=oc20_s2ef", f"data.train_path={tmp_path}", f"data.val_path={tmp_path}"])
    t = s2ef.trainer
    assert (s2ef.data.batch_size, t.lr, t.max_epochs, t.weight_decay, t.energy_coefficient, t.force_coefficient) == \
        (64, 4e-4, 30, 1e-3, 2.0, 100.0)
    assert (t.warmup_factor, t.lr_min_factor, t.clip_grad_norm, t.ema_decay) == (0.2, 0.01, 100.0, 0.999)
    assert (t.normalizer.energy_mean, t.normalizer.energy_std) == (-0.7554, 2.8873)
    assert s2ef.model.regress_forces == "direct"
    is2re = load_config(["+experiment=oc20_is2re", f"data.train_path={tmp_path}", f"data.val_path={tmp_path}"])
    assert is2re.data.task == "is2re" and is2re.model.regress_forces is None


@pytest.mark.parametrize("overrides,needle", [
    (["trainer.lrr=1e-3"], "'trainer.lrr': did you mean 'trainer.lr'"),
    (["+trainer.lrr=1e-3"], "'trainer.lrr'"),
    (["+data.subsett=10"], "'data.subset'"),
    (["+experiment=qm9", "model.lmaxx=4"], "model.lmax"),
    (["data.batch_size=many"], "data.batch_size"),
    (["+experiment=oc20_s2ef"], "data.train_path is not set"),
    (["+experiment=oc20_s2ef", "data.train_path=/no/such/dir", "data.val_path=/tmp"], "/no/such/dir"),
    (["+experiment=qm9", "data.root=/no/such/qm9"], "data.root='/no/such/qm9' does not exist"),
    (["+experiment=qm9", "model.regress_forces=direct"], "incompatible with data.task=qm9"),
    (["+experiment=qm9", "data.targets=[4,7]"], "model.num_targets=2"),
    (["+experiment=qm9", "data.targets=[25]"], "0..18"),
    (["+experiment=nope"], "experiment/nope"),
    (["mode=eval", "run_dir=/no/run"], "needs a checkpoint"),
])
def test_config_errors_name_key_and_fix(overrides, needle):
    with pytest.raises(ConfigError) as err:
        load_config(overrides)
    assert needle in str(err.value)
    assert "Fix" in str(err.value) or "did you mean" in str(err.value) or "experiment/nope" in str(err.value)


def test_qm9_energies_default_to_fitted_atom_references():
    """U0/U/H/G are learned on top of per-element references fitted on the training split by default
    (fairchem's linear references, MACE's E0s); b3lyp and none stay available."""
    from est.train.config import load_config

    assert load_config(["+experiment=qm9_quick"]).data.atomref == "fit"
    assert load_config(["+experiment=qm9_quick", "data.atomref=b3lyp"]).data.atomref == "b3lyp"
