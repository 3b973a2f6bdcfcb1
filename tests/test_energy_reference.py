"""Fitted per-element energy references for S2EF / IS2RE (data.atomref=fit, the default): the fit, unseen
elements, the config rules, and a training run on .aselmdb data whose checkpoint predicts total energies in
mode=eval and through ESTCalculator."""
import os

import numpy as np
import pytest
import torch
from torch_geometric.data import Batch

from est.data.sample import make_sample
from est.train.config import ConfigError, NormalizerConfig, load_config
from est.train.tasks import IS2RETask, S2EFTask

from test_train_helpers import emt_samples

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = os.path.join(os.path.dirname(HERE), "configs")
W = {1: -3.4, 8: -7.1, 29: -1.9}  # eV per atom


def _molecules(n, seed=0, elements=(1, 8, 29), noise=0.05):
    """Random compositions with E = sum_i W[z_i] + noise (positions irrelevant to the fit)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        z = rng.choice(elements, size=rng.integers(2, 9))
        e = sum(W.get(int(v), -5.0) for v in z) + noise * rng.normal()
        out.append(make_sample(pos=rng.normal(size=(len(z), 3)) * 3, atomic_numbers=z, energy=e,
                               forces=np.zeros((len(z), 3)), idx=i))
    return out


def test_fit_recovers_references_and_leaves_unseen_elements_nan():
    data = _molecules(60)
    task = S2EFTask(atomref="fit")
    norm = task.fit_normalizers(data, NormalizerConfig())
    ref = norm["atomref"]
    assert ref.shape == (119,) and ref.dtype == torch.float64
    for z, w in W.items():
        assert float(ref[z]) == pytest.approx(w, abs=0.03)
    assert torch.isnan(ref[[0, 2, 6, 79]]).all()
    residual = torch.tensor([float(s.energy) - float(ref[s.atomic_numbers].sum()) for s in data], dtype=torch.float64)
    assert float(norm["energy_mean"]) == pytest.approx(float(residual.mean()), abs=1e-5)
    assert float(norm["energy_std"]) == pytest.approx(float(residual.std()), rel=1e-4)
    assert float(norm["energy_std"]) < 0.1  # the references took out the size-extensive part
    # targets: (E - sum ref - mu) / sigma; predictions add the references back (total energies)
    b = Batch.from_data_list(data[:4])
    out = {"energy": torch.zeros(4), "forces": torch.zeros(b.num_nodes, 3)}
    pred, target = task._energy(out, b)
    expect = (residual[:4] - norm["energy_mean"]) / norm["energy_std"]
    assert torch.allclose(target.double(), expect, atol=1e-4)
    ref_sums = np.array([float(ref[s.atomic_numbers].sum()) for s in data[:4]])
    assert np.allclose(task.predictions(out, b)["energy_pred"], float(norm["energy_mean"]) + ref_sums, atol=1e-6)
    # an element the fit never saw, never a silent zero: training stops naming it; evaluation warns once and
    # counts it 0 eV (val/test sets may hold elements the training split lacks)
    carbon = Batch.from_data_list(_molecules(2, seed=1, elements=(6, 8)))
    out2 = {"energy": torch.zeros(2), "forces": torch.zeros(carbon.num_nodes, 3)}
    with pytest.raises(ValueError, match=r"elements \[6\] have no fitted energy reference"):
        task.loss(out2, carbon, torch.tensor([2.0, 1.0]), 1)
    with pytest.warns(UserWarning, match=r"elements \[6\] that the training structures .* lack: they count 0 eV"):
        task.accumulate({}, out2, carbon)
    o_only = float(ref[8]) * (carbon.atomic_numbers == 8).double()
    expect = float(norm["energy_mean"]) + torch.zeros(2, dtype=torch.float64).index_add_(0, carbon.batch, o_only)
    assert np.allclose(task.predictions(out2, carbon)["energy_pred"], expect.numpy(), atol=1e-6)


def test_fit_from_a_bounded_sample_checks_dataset_metadata():
    class WithMetadata(list):
        elements = [1, 8, 29, 79]  # gold is in the data but not in the first structures

    data = WithMetadata(_molecules(40))
    with pytest.raises(ValueError, match=r"elements \[79\] .* absent from 10 random training structures \(of 40\)"):
        IS2RETask(atomref="fit").fit_normalizers(data, NormalizerConfig(max_samples=10))
    norm = IS2RETask(atomref="none").fit_normalizers(data, NormalizerConfig(max_samples=10))
    assert "atomref" not in norm


def test_config_rules(tmp_path):
    paths = [f"data.train_path={tmp_path}", f"data.val_path={tmp_path}"]
    assert load_config(["data=oc20_s2ef", "model=est_tiny", "model.regress_forces=direct", *paths]).data.atomref == "fit"
    with pytest.raises(ConfigError, match="b3lyp is QM9's"):
        load_config(["data=oc20_s2ef", "model=est_tiny", "model.regress_forces=direct", "data.atomref=b3lyp", *paths])
    with pytest.raises(ConfigError, match="atomref=fit with fixed trainer.normalizer"):
        load_config(["data=oc20_s2ef", "model=est_tiny", "model.regress_forces=direct",
                     "trainer.normalizer.energy_mean=0.0", *paths])
    # EquiformerV2's OC20 recipe keeps its published normaliser of the (referenced) adsorption energies
    assert load_config(["+experiment=oc20_s2ef", *paths]).data.atomref == "none"


def test_training_on_aselmdb_predicts_total_energies(tmp_path):
    from est.calculators import ESTCalculator
    from est.data import write_aselmdb
    from est.train.checkpoint import load_checkpoint
    from est.train.cli import main
    from est.train.trainer import evaluate_checkpoint

    train, val = emt_samples(12, 0), emt_samples(4, 1)
    write_aselmdb(tmp_path / "train", train, rows_per_file=5)
    write_aselmdb(tmp_path / "val", val)
    run = tmp_path / "run"
    assert main(["data=oc20_s2ef", "model._target_=test_train_helpers.PairModel", "model.name=pair",
                 "model.regress_forces=direct", "model.use_pbc=true", f"data.train_path={tmp_path / 'train'}",
                 f"data.val_path={tmp_path / 'val'}", "data.num_workers=0", "data.batch_size=4",
                 "trainer.max_epochs=1", "trainer.progress=false", "trainer.plots=false", f"run_dir={run}",
                 "trainer.final_splits=[val]"], config_dir=CONFIGS) == 0
    ck = load_checkpoint(str(run / "best.pt"))
    ref = ck["normalizers"]["atomref"]
    assert torch.isfinite(ref[[1, 8, 29]]).all() and int(torch.isfinite(ref).sum()) == 3
    assert sorted(ck["elements"]) == [1, 8, 29]
    # mode=eval: predictions are total EMT energies (tens of eV), errors are small next to them
    res = evaluate_checkpoint(load_config(["mode=eval", f"run_dir={run}", "eval_splits=[val]"]),
                              ["mode=eval", f"run_dir={run}"])
    p = np.load(run / "eval" / "predictions_val.npz")
    true = np.array([float(s.energy) for s in val])
    assert np.allclose(p["energy_true"], true, atol=1e-5)
    assert np.abs(p["energy_pred"] - true).mean() == pytest.approx(res["val"]["energy_mae"], rel=1e-5)
    assert np.abs(true).min() > 5 * res["val"]["energy_mae"]
    # the ASE calculator restores the same references and normalisers
    from ase import Atoms

    s = val[0]
    atoms = Atoms(numbers=s.atomic_numbers.numpy(), positions=s.pos.double().numpy(), cell=s.cell[0].double().numpy(),
                  pbc=s.pbc[0].numpy())
    atoms.calc = ESTCalculator.from_checkpoint(str(run / "best.pt"))
    assert atoms.get_potential_energy() == pytest.approx(float(p["energy_pred"][0]), abs=1e-3)
