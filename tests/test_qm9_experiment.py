"""The qm9 experiment at a QM9 size (est_qm9 / eqv2_qm9) and the start-up time-per-epoch estimate."""
import os
import re

import pytest
import torch
import yaml

from est.models.registry import MODEL_CONFIGS
from est.train.config import ConfigError, load_config, validate_numbers
from est.train.epoch_time import EpochTimer, format_duration
from est.train.loading import build_model_from_config
from est.train.trainer import Trainer

from test_train_helpers import emt_samples

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = os.path.join(os.path.dirname(HERE), "configs")
#: parameters with one property head, counted at this commit; the bound is Equiformer's QM9 size (~3.5M) + 10 %
PARAMS = {"qm9": ("est-qm9", 3_100_033), "qm9_eqv2": ("eqv2-qm9", 3_812_737)}
BOUND = 3_850_000


@pytest.mark.parametrize("experiment", sorted(PARAMS))
def test_qm9_experiment_builds_a_qm9_sized_model(experiment):
    cfg = load_config([f"+experiment={experiment}", "model.avg_num_nodes=18.0", "model.avg_degree=15.6"], check=False)
    name, count = PARAMS[experiment]
    assert cfg.model.name == name and cfg.name == experiment and cfg.run_dir == f"runs/{experiment}"
    model = build_model_from_config(cfg)
    n = sum(p.numel() for p in model.parameters())
    assert n == count and n < BOUND
    assert cfg.model["update"] == ("est" if name == "est-qm9" else "ffn")


def test_qm9_model_yaml_is_the_registry_shape():
    """configs/model/est_qm9.yaml spells out the est-qm9 preset with its sources: the numbers must agree."""
    with open(os.path.join(CONFIGS, "model", "est_qm9.yaml")) as fh:
        spelled = yaml.safe_load(fh)
    preset = MODEL_CONFIGS[spelled.pop("name")]
    spelled["grid_resolution"] = tuple(spelled["grid_resolution"])
    assert spelled == preset
    assert MODEL_CONFIGS["eqv2-qm9"] == dict(preset, update="ffn")


def test_epoch_timer_arithmetic():
    """Warm-up steps untimed, evaluation excluded, one report; a short run reports what it timed."""
    now = [0.0]
    t = EpochTimer(steps_per_epoch=860, device=torch.device("cpu"), warmup=2, steps=3, clock=lambda: now[0])
    msgs = []
    for wall, ev in ((9.0, 0.0), (9.0, 0.0), (2.0, 0.0), (7.0, 5.0), (2.0, 5.0), (2.0, 5.0)):  # step 4 evaluates 5 s
        now[0] += wall
        msgs.append(t.step_done(eval_seconds=ev))
    # steps 3-5 after two warm-up steps: 11 s of wall, 5 s of it evaluation -> 2 s a step
    assert msgs[:4] == [None] * 4 and msgs[5] is None and t.finish() is None
    assert t.seconds_per_step == pytest.approx(2.0)
    assert "~ 28.7 min on cpu (" in msgs[4] and "860 steps x 2 s/step" in msgs[4]
    assert "from 3 step(s) after 2 warm-up" in msgs[4]
    short = EpochTimer(steps_per_epoch=10, device=torch.device("cpu"), warmup=1, steps=5, clock=lambda: now[0])
    for _ in range(3):
        now[0] += 1.5
        assert short.step_done() is None
    assert "10 steps x 1.5 s/step" in short.finish() and short.finish() is None
    assert format_duration(42) == "42 s" and format_duration(3 * 3600 + 12 * 60) == "3 h 12 min"
    with pytest.raises(ValueError, match="warmup >= 1"):
        EpochTimer(steps_per_epoch=1, device=torch.device("cpu"), warmup=0)


def test_startup_prints_params_and_time_per_epoch(tmp_path, capsys):
    cfg = load_config(["data=oc20_s2ef", "model._target_=test_train_helpers.PairModel", "model.name=pair",
                       "model.regress_forces=gradient", "model.use_pbc=true", f"run_dir={tmp_path / 'run'}",
                       "data.batch_size=2", "data.num_workers=0", "trainer.max_steps=4", "trainer.progress=false",
                       "trainer.plots=false", "trainer.final_splits=[]", "trainer.epoch_time_warmup=1",
                       "trainer.epoch_time_steps=2"], check=False)
    tr = Trainer(cfg, datasets={"train": emt_samples(8, 0), "val": emt_samples(2, 1)})
    nparam = sum(p.numel() for p in tr.module.parameters())
    assert tr.fit() == "finished"
    out = capsys.readouterr().out
    assert f"params={nparam:,}" in out
    lines = [ln for ln in out.splitlines() if "time per epoch" in ln]
    assert len(lines) == 1
    m = re.search(r"time per epoch ~ .+ on cpu \(\d+ threads\): 4 steps x ([0-9.e+-]+) s/step, "
                  r"estimated from 2 step\(s\) after 1 warm-up step\(s\)", lines[0])
    assert m and float(m.group(1)) > 0
    assert out.index("params=") < out.index("time per epoch") < out.index("step 4/4")
    with pytest.raises(ConfigError, match="trainer.epoch_time_warmup=0"):
        validate_numbers(load_config(["trainer.epoch_time_warmup=0"], check=False))
