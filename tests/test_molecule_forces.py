"""``+experiment=molecule_forces``: the validation tail of ``data.val_fraction``, the generator choice of
``data.generate`` and a real run that builds its GFN2-xTB set on first use (the experiment's numbers are
tied to the force study in tests/test_study_forces.py)."""
import math

import numpy as np
import pytest

from est.train.config import ConfigError, load_config
from est.train.data import hold_out_tail


def test_hold_out_tail_is_the_last_frames_in_file_order():
    frames = list(range(20))
    head, tail = hold_out_tail(frames, 0.05)
    assert head.indices.tolist() == list(range(19)) and tail.indices.tolist() == [19]
    head, tail = hold_out_tail(frames, 0.26)  # round(5.2) = 5
    assert head.indices.tolist() == list(range(15)) and tail.indices.tolist() == list(range(15, 20))
    assert hold_out_tail(frames[:3], 0.01)[1].indices.tolist() == [2]  # at least one frame
    with pytest.raises(ValueError, match=r"val_fraction=0.9 of 1 training samples leaves none to train on.*Fix"):
        hold_out_tail(frames[:1], 0.9)


@pytest.mark.parametrize("overrides,needle", [
    (["data.val_fraction=1.5"], r"data.val_fraction=1.5 must be a fraction in \(0, 1\)\. Fix"),
    (["data.val_fraction=0"], r"data.val_fraction=0.0 must be a fraction in \(0, 1\)\. Fix"),
    (["data.val_path=/somewhere"], r"data.val_fraction=0.05 and data.val_path='/somewhere' both give a validation set.*Fix"),
    (["data.generator=est.data.qm9"], r"data.generator='est.data.qm9' is not valid\. Fix: choose one of .*'est.data.xtb'"),
])
def test_bad_molecule_forces_configs_are_named(overrides, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(["+experiment=molecule_forces", *overrides])


def test_val_fraction_is_refused_for_qm9():
    with pytest.raises(ConfigError, match="QM9 has its standard validation split. Fix: data.val_fraction=null"):
        load_config(["+experiment=qm9_quick", "data.val_fraction=0.1"])


def test_experiment_generates_its_set_and_trains(tmp_path):
    """The experiment on a few frames of ethanol: ``python -m est.data.xtb`` runs because train_path is missing,
    the last of the 8 training frames validates, the test trajectory tests, and the run ends finite."""
    pytest.importorskip("tblite")
    from est.train.trainer import Trainer

    cfg = load_config(["+experiment=molecule_forces", f"data.generate_dir={tmp_path / 'xtb'}",
                       "data.generate_args=[--molecules,ethanol,--train-frames,8,--test-frames,2,--stride,3,"
                       "--equilibration-steps,6,--chunk-frames,4,--seed,1,--quiet]",
                       "data.val_fraction=0.125", "data.batch_size=2", "data.eval_batch_size=2",
                       "trainer.max_steps=2", "trainer.warmup_steps=1", "trainer.progress=false",
                       "trainer.plots=false", "trainer.tensorboard=false", f"run_dir={tmp_path / 'run'}"])
    tr = Trainer(cfg)
    assert [len(tr.datasets[s]) for s in ("train", "val", "test")] == [7, 1, 2]
    assert tr.datasets["val"].indices.tolist() == [7]
    assert tr.datasets["val"].dataset is tr.datasets["train"].dataset  # one reader of the training file
    assert tr.fit() == "finished"
    for split in ("val", "test"):
        assert math.isfinite(tr.final_results[split]["forces_mae"]), split
    assert np.isfinite(tr.final_results["test"]["energy_mae"])
