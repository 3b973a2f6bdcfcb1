"""The EST block's options nest in the model config (model.est.*); old flat keys get a 'renamed' error
and old checkpoints keep loading."""
import pytest

from est.models import ESTOptions, build_model, model_config
from est.models.backbone import update_block_config
from est.models.config import migrate_model_keys
from est.models.registry import migrate_defaults
from est.train.config import ConfigError, load_config
from est.train.loading import build_model_from_config


def test_nested_options_reach_the_block_and_merge_with_the_preset():
    cfg = model_config("est-paper-tiny", est={"num_heads": 2, "grid": {"num_points": 80}})
    assert isinstance(cfg.est, ESTOptions) and cfg.est.preset == "paper"  # the shape's preset is kept
    block = update_block_config(cfg)
    assert block.num_heads == 2 and block.grid.kind == "fibonacci" and block.grid.num_points == 80
    # the steerable experts' grid is reachable (it was not before)
    block = update_block_config(model_config("est-tiny", est={"steerable_grid": {"degree": 12}}))
    assert block.ffn_grid.kind == "design" and block.ffn_grid.degree == 12
    # replace() merges too
    again = cfg.replace(est={"grid": {"num_points": 90}})
    assert again.est.preset == "paper" and again.est.num_heads == 2 and again.est.grid.num_points == 90


def test_flat_keys_are_renamed_errors_everywhere():
    with pytest.raises(ValueError, match=r"est_preset -> est.preset"):
        model_config("est-tiny", est_preset="paper")
    with pytest.raises(ValueError, match=r"est_grid_degree -> est.grid.degree"):
        build_model("est-tiny", est_grid_degree=9)
    with pytest.raises(ValueError, match="unknown option.*model.est.gird"):
        model_config("est-tiny", est={"gird": {"degree": 9}})
    with pytest.raises(ConfigError, match=r"est_grid_rotation -> est.grid_rotation"):
        load_config(["+experiment=oc20_s2ef_quick", "model.est_grid_rotation=false"])


def test_hydra_nested_overrides_compose():
    cfg = load_config(["+experiment=oc20_s2ef_quick", "model.est.preset=paper", "model.est.grid.num_points=80"],
                      check=False)
    assert cfg.model.est.preset == "paper" and cfg.model.est.grid.num_points == 80


def test_old_checkpoint_model_keys_migrate():
    old = {"name": "est-tiny", "est_preset": "paper", "est_grid_kind": "fibonacci", "est_grid_num_points": 80,
           "est_num_heads": None, "lmax": 2}
    new = migrate_model_keys(old)
    assert new == {"name": "est-tiny", "lmax": 2, "est": {"preset": "paper", "grid": {"kind": "fibonacci", "num_points": 80}}}
    assert model_config(**new).est.grid.num_points == 80


def test_default_preset_caps_the_logits_and_zero_turns_it_off():
    """The EST default bounds its attention logits by 4; ``model.est.logit_cap=0`` is the uncapped block,
    the paper preset and per-point projections have no cap (it needs band-limited logits)."""
    def caps(**est):
        model = build_model("est-tiny", update="est", est=est)
        return [b.config.logit_cap for b in model.modules() if type(b).__name__ == "SphericalTransformer"]

    assert caps() == [4.0, 4.0]
    assert caps(logit_cap=0) == [None, None] and caps(logit_cap=2.5) == [2.5, 2.5]
    assert caps(preset="paper") == [None, None] and caps(projections="points") == [None, None]
    with pytest.raises(ValueError, match=r"model.est.logit_cap must be >= 0"):
        model_config("est-tiny", est={"logit_cap": -1.0})
    cfg = load_config(["+experiment=oc20_s2ef_quick", "model.update=est", "model.est.logit_cap=0"], check=False)
    assert cfg.model.est.logit_cap == 0


def test_value_skip_is_off_by_default_and_reaches_every_block():
    def skips(**est):
        model = build_model("est-tiny", update="est", est=est)
        return [b.config.value_skip for b in model.modules() if type(b).__name__ == "SphericalTransformer"]

    assert skips() == [False, False] and skips(value_skip=True) == [True, True]
    cfg = load_config(["+experiment=oc20_s2ef_quick", "model.update=est", "model.est.value_skip=true"], check=False)
    assert cfg.model.est.value_skip is True


@pytest.mark.parametrize("version, est, expected", [
    (1, {"preset": "default"}, 0.0),  # an uncapped EST default of before version 2 stays uncapped
    (1, {"preset": "default", "logit_cap": 4.0}, 4.0),
    (1, {"preset": "paper"}, None),
    (1, {"preset": "default", "projections": "points"}, None),
    (2, {"preset": "default"}, None),  # today's None: the preset's cap
])
def test_checkpoint_defaults_migrate(version, est, expected):
    model = migrate_defaults({"name": "eqv2-tiny", "update": "est", "est": est}, version)
    assert model["est"].get("logit_cap") == expected
    by_name = migrate_defaults({"name": "est-tiny", "est": est}, version)  # update="est" from the named shape
    assert by_name["est"].get("logit_cap") == expected
    for ffn in ({"name": "est-tiny", "update": "ffn", "est": {"preset": "default"}}, {"name": "eqv2-tiny"},
                {"name": "est-paper-tiny"}, {"_target_": "my.Model", "update": "est"}):
        assert migrate_defaults(ffn, 1) == ffn  # no capped block: nothing to pin (resuming it needs no change)


def test_old_checkpoint_loads_uncapped_and_new_one_records_its_defaults(tmp_path):
    """A checkpoint without ``model_defaults`` (written before the cap became the default) rebuilds the
    uncapped model it was trained as; the trainer writes the current version."""
    from est.models.config import MODEL_DEFAULTS_VERSION
    from est.train.checkpoint import save_checkpoint
    from est.train.config import to_container
    from est.train.loading import load_trained_model

    cfg = load_config(["+experiment=oc20_s2ef_quick", "model.update=est", "model.avg_num_nodes=10",
                       "model.avg_degree=5"], check=False)
    model = build_model_from_config(cfg)
    ck = {"config": to_container(cfg), "model": model.state_dict()}
    save_checkpoint(ck, str(tmp_path / "old.pt"))
    old, _ = load_trained_model(str(tmp_path / "old.pt"))
    assert {b.config.logit_cap for b in old.modules() if type(b).__name__ == "SphericalTransformer"} == {None}
    save_checkpoint({**ck, "model_defaults": MODEL_DEFAULTS_VERSION}, str(tmp_path / "new.pt"))
    new, _ = load_trained_model(str(tmp_path / "new.pt"))
    assert {b.config.logit_cap for b in new.modules() if type(b).__name__ == "SphericalTransformer"} == {4.0}


def test_resuming_an_uncapped_run_names_the_option():
    """Resuming a run trained before defaults v2 under today's default is refused with the option that
    resumes it as trained; with that option the configs agree."""
    from est.models.registry import migrate_defaults
    from est.train.run_dir import check_same_model

    now = {"name": "est-tiny", "update": "est", "est": {"preset": "default", "logit_cap": None}}
    saved = migrate_defaults(now, 1)
    with pytest.raises(ConfigError, match=r"model\.est\).*add model\.est\.logit_cap=0 to resume it"):
        check_same_model(saved, now, "run/last.pt")
    check_same_model(saved, {**now, "est": {"preset": "default", "logit_cap": 0}}, "run/last.pt")
    with pytest.raises(ConfigError, match=r"model\.lmax\)\. Fix: use a new run_dir"):
        check_same_model(saved, {**now, "lmax": 2, "est": {"preset": "default", "logit_cap": 0}}, "run/last.pt")
