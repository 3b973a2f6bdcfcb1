"""est.train end to end: tiny S2EF (LMDB) and QM9 (real records) runs, exact resume after SIGTERM,
the NaN guard, evaluation of a checkpoint, the CLI."""
import json
import os
import signal

import numpy as np
import pytest
import torch

from est.train.checkpoint import load_checkpoint
from est.train.cli import main
from est.train.config import load_config
from est.train.trainer import NonFiniteLossError, Trainer, evaluate_checkpoint

from test_train_helpers import emt_samples

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = os.path.join(os.path.dirname(HERE), "configs")
QM9_CSV = os.path.join(HERE, "data", "qm9_records.csv")
PAIR = "model._target_=test_train_helpers.PairModel"


def _s2ef_cfg(run_dir, *extra):
    return load_config(["data=oc20_s2ef", PAIR, "model.name=pair", "model.regress_forces=gradient", "model.use_pbc=true",
                        "model.dropout=0.2", f"run_dir={run_dir}", "data.batch_size=4", "data.num_workers=0",
                        "trainer.max_epochs=2", "trainer.log_every=1", "trainer.progress=false", "trainer.plots=false",
                        "trainer.ema_decay=0.9", "trainer.lr=2e-3", "trainer.warmup_steps=2", *extra], check=False)


@pytest.fixture(scope="module")
def s2ef_data():
    return {"train": emt_samples(16, 0), "val": emt_samples(6, 1)}


def _params(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_resume_after_sigterm_is_exact(tmp_path, s2ef_data):
    # uninterrupted
    a = Trainer(_s2ef_cfg(tmp_path / "a"), datasets=s2ef_data)
    assert a.fit() == "finished"
    # killed by SIGTERM after step 1 (stops after the step in flight), then resumed by a new process-like Trainer
    b = Trainer(_s2ef_cfg(tmp_path / "b"), datasets=s2ef_data)

    def kill(tr):
        if tr.step == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    b.on_step_end = kill
    assert b.fit() == "interrupted"
    ck = load_checkpoint(str(tmp_path / "b" / "last.pt"))
    assert ck["step"] == 2 and ck["sampler"]["position"] == 2 and ck["epoch"] == 0  # mid-epoch (4 steps/epoch)
    assert set(ck) >= {"model", "optimizer", "scheduler", "ema", "normalizers", "rng", "sampler", "config", "best",
                       "model_defaults"}
    assert ck["config"]["trainer"]["max_epochs"] == 2 and ck["config"]["model"]["_target_"].endswith("PairModel")
    b2 = Trainer(_s2ef_cfg(tmp_path / "b"), datasets=s2ef_data)
    assert b2.step == 2
    assert b2.fit() == "finished"
    assert b2.step == a.step == 8
    pa, pb = _params(a.module), _params(b2.module)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    ea, eb = _params(a.ema.module), _params(b2.ema.module)
    assert all(torch.equal(ea[k], eb[k]) for k in ea)
    assert a.final_results == b2.final_results
    rows = lambda p: [l for l in open(p / "metrics.csv").read().splitlines() if ",val," in l]
    strip = lambda r: r.split(",")[:5] + r.split(",")[8:]  # drop timing columns
    assert [strip(r) for r in rows(tmp_path / "a")] == [strip(r) for r in rows(tmp_path / "b")]
    # the run learned something: better than the mean predictor on held-out forces
    m = a.final_results["val"]
    assert m["forces_mae"] < m["base_forces_mae"] and m["forces_cos"] > 0.2, m


def test_nan_loss_stops_with_step_and_ids_and_keeps_weights(tmp_path):
    data = {"train": emt_samples(8, 0, nan_at=5), "val": emt_samples(2, 1)}
    with pytest.warns(UserWarning, match="not finite"):  # the energy normaliser skips the NaN
        tr = Trainer(_s2ef_cfg(tmp_path / "nan", "trainer.max_epochs=1", "model.dropout=0.0", "data.shuffle=false"),
                     datasets=data)
    snaps = []
    tr.on_step_end = lambda t: snaps.append(_params(t.module))
    with pytest.raises(NonFiniteLossError) as err:
        tr.fit()
    msg = str(err.value)
    assert "step 1" in msg and "sid=[4, 5, 6, 7]" in msg and "max_bad_batches" in msg
    now = _params(tr.module)
    assert all(torch.equal(now[k], snaps[-1][k]) for k in now) and all(torch.isfinite(v).all() for v in now.values())
    # skipping is allowed when asked for
    tr2 = Trainer(_s2ef_cfg(tmp_path / "skip", "trainer.max_epochs=1", "model.dropout=0.0", "data.shuffle=false",
                            "trainer.max_bad_batches=1"), datasets=data)
    assert tr2.fit() == "finished" and tr2.bad_batches == 1


def test_s2ef_lmdb_run_outputs_and_eval_checkpoint(tmp_path):
    from est.data import write_lmdb

    write_lmdb(str(tmp_path / "train"), emt_samples(12, 0))
    write_lmdb(str(tmp_path / "val"), emt_samples(4, 1))
    run = tmp_path / "run"
    overrides = ["data=oc20_s2ef", PAIR, "model.name=pair", "model.regress_forces=direct", "model.use_pbc=true",
                 f"data.train_path={tmp_path / 'train'}", f"data.val_path={tmp_path / 'val'}", "data.num_workers=0",
                 "data.batch_size=4", "trainer.max_epochs=2", "trainer.progress=false", f"run_dir={run}",
                 "trainer.final_splits=[val]", "model.avg_num_nodes=auto", "model.avg_degree=auto", "model.cutoff=4.0"]
    assert main(overrides, config_dir=CONFIGS) == 0
    for f in ("last.pt", "best.pt", "metrics.csv", "learning_curve.png", "parity_val.png", "final_metrics.json"):
        assert (run / f).is_file(), f
    ck = load_checkpoint(str(run / "best.pt"))
    assert ck["config"]["model"]["avg_num_nodes"] == pytest.approx(np.mean([s.num_nodes for s in emt_samples(12, 0)]))
    assert ck["config"]["model"]["avg_degree"] > 1.0
    final = json.load(open(run / "final_metrics.json"))["results"]["val"]
    # evaluate the checkpoint: same metrics, a predictions file
    cfg = load_config(["mode=eval", f"run_dir={run}", "eval_splits=[val]"])
    res = evaluate_checkpoint(cfg, ["mode=eval", f"run_dir={run}"])
    assert res["val"]["forces_mae"] == pytest.approx(final["forces_mae"], rel=1e-6)
    p = np.load(run / "eval" / "predictions_val.npz")
    assert p["energy_pred"].shape == (4,) and p["forces_pred"].shape == p["forces_true"].shape
    # running the finished command again resumes and does nothing
    assert main(overrides, config_dir=CONFIGS) == 0


def test_qm9_real_records_cli(tmp_path, capsys):
    run = tmp_path / "qm9"
    args = ["+experiment=qm9_quick", PAIR, "model.name=pair", f"data.root={QM9_CSV}", f"data.cache_dir={tmp_path / 'cache'}",
            "data.targets=[7,4]", "model.num_targets=2", "data.subset=null", "data.batch_size=4",
            "trainer.max_epochs=3", "trainer.progress=false", "trainer.plots=false", f"run_dir={run}"]
    # qm9_quick sets model.regress_energy (an est.models option) that the test model does not have
    assert main(args, config_dir=CONFIGS) == 2
    assert "model.regress_energy is not an option" in capsys.readouterr().err
    assert main(args + ["~model.regress_energy", "~model.lmax", "~model.mmax"], config_dir=CONFIGS) == 0
    out = capsys.readouterr().out
    assert "mae_U0 [meV]" in out and "mae_gap [meV]" in out and "mean predictor" in out
    res = json.load(open(run / "final_metrics.json"))["results"]
    assert set(res) == {"test"} and res["test"]["base_mae_U0"] > 0  # qm9_quick reports the test split


def test_is2re_lmdb_relaxed_energy(tmp_path):
    """IS2RE files (y_init / y_relaxed, no energy key) through data.key_map, energy MAE and within-0.02 eV."""
    from est.data import write_lmdb

    def records(n, seed):
        out = []
        for s in emt_samples(n, seed):
            out.append({"pos": s.pos.numpy(), "atomic_numbers": s.atomic_numbers.numpy(), "cell": s.cell.numpy(),
                        "pbc": s.pbc.numpy(), "fixed": s.fixed.numpy(), "tags": s.tags.numpy(), "sid": s.sid.numpy(),
                        "y_init": s.energy.numpy(), "y_relaxed": (s.energy - 0.5).numpy()})
        return out

    write_lmdb(str(tmp_path / "train.lmdb"), records(8, 0))
    write_lmdb(str(tmp_path / "val.lmdb"), records(4, 1))
    cfg = load_config(["+experiment=oc20_is2re", PAIR, "model.name=pair", "~model.max_neighbors", "model.cutoff=4.0",
                       f"data.train_path={tmp_path / 'train.lmdb'}", f"data.val_path={tmp_path / 'val.lmdb'}",
                       "data.num_workers=0", "data.batch_size=4", "trainer.max_epochs=2", "trainer.progress=false",
                       "trainer.plots=false", f"run_dir={tmp_path / 'run'}", "trainer.final_splits=[val]"])
    tr = Trainer(cfg)
    assert float(tr.datasets["train"][0].energy) == pytest.approx(float(emt_samples(1, 0)[0].energy) - 0.5, abs=1e-5)
    assert tr.fit() == "finished"
    m = tr.final_results["val"]
    assert set(m) >= {"energy_mae", "energy_ewt", "base_energy_mae", "base_energy_ewt"} and 0 <= m["energy_ewt"] <= 1


def test_real_est_model_through_config(tmp_path):
    """The wiring to est.models.build_model: a reduced est-tiny, two S2EF steps and two QM9 steps."""
    import est.models as models
    if not hasattr(models, "build_model"):
        pytest.skip("est.models.build_model not available")
    from est.data import write_lmdb

    write_lmdb(str(tmp_path / "s2ef"), emt_samples(4, 0))
    small = ["model.lmax=1", "model.mmax=1", "model.channels=8", "model.num_layers=1", "trainer.max_steps=2",
             "trainer.progress=false", "trainer.plots=false", "data.num_workers=0", "trainer.final_splits=[val]"]
    s2ef = load_config(["+experiment=oc20_s2ef_quick", "data.generate=false", f"data.train_path={tmp_path / 's2ef'}",
                        f"data.val_path={tmp_path / 's2ef'}", "data.batch_size=2", f"run_dir={tmp_path / 'a'}", *small])
    tr = Trainer(s2ef)
    assert tr.fit() == "finished" and np.isfinite(tr.final_results["val"]["forces_mae"])
    assert tr.model_cfg["avg_num_nodes"] == pytest.approx(np.mean([s.num_nodes for s in emt_samples(4, 0)]))
    qm9 = load_config(["+experiment=qm9_quick", f"data.root={QM9_CSV}", f"data.cache_dir={tmp_path / 'cache'}",
                       "data.subset=null", "data.batch_size=4", f"run_dir={tmp_path / 'b'}", *small])
    tr = Trainer(qm9)
    assert tr.fit() == "finished" and np.isfinite(tr.final_results["val"]["mae_U0"])
