"""The EST block's options nest in the model config (model.est.*); old flat keys get a 'renamed' error
and old checkpoints keep loading."""
import pytest

from est.models import ESTOptions, build_model, model_config
from est.models.backbone import update_block_config
from est.models.config import migrate_model_keys
from est.train.config import ConfigError, load_config


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
