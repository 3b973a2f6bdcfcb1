"""Named model configurations and ``build_model``.

Published EquiformerV2 shapes (OC20, reference.md) and the EST paper code's
defaults, plus small CPU sizes. Dataset statistics (``avg_num_nodes``,
``avg_degree``) in the OC20 shapes are OC20's; override them for other data.
"""
from __future__ import annotations

from collections.abc import Mapping

from .config import ModelConfig, check_renamed, merge_est
from .model import EquiformerV2

__all__ = ["MODEL_CONFIGS", "build_model", "list_models", "model_config", "migrate_defaults"]

_EQV2_OC20 = dict(
    channels=128, attn_hidden_channels=64, num_heads=8, attn_alpha_channels=64, attn_value_channels=16,
    ffn_hidden_channels=128, edge_channels=128, norm="layer_norm_sh", grid_resolution=(18, 18),
    cutoff=12.0, max_neighbors=20, use_pbc=True, num_radial=600, alpha_drop=0.1,
    avg_num_nodes=77.81, avg_degree=23.39, update="ffn", regress_forces="direct",
)

_TINY = dict(
    num_layers=2, lmax=3, mmax=2, channels=32, attn_hidden_channels=32, num_heads=2, attn_alpha_channels=8,
    attn_value_channels=8, ffn_hidden_channels=64, edge_channels=32, num_radial=32, grid_resolution=(10, 9),
    norm="rms_norm_sh", cutoff=5.0, max_neighbors=None, drop_path=0.0, alpha_drop=0.0,
    avg_num_nodes=18.0, avg_degree=15.0, max_num_elements=90,
)

# QM9-sized: Equiformer's QM9 model (6 blocks, L = 2, ~3.5M parameters) in this backbone's layout;
# the source of every number is in configs/model/est_qm9.yaml (a test checks both agree)
_QM9 = dict(
    num_layers=6, lmax=2, mmax=2, channels=64, attn_hidden_channels=64, num_heads=4, attn_alpha_channels=32,
    attn_value_channels=16, ffn_hidden_channels=192, edge_channels=64, num_radial=128, grid_resolution=(10, 9),
    norm="layer_norm_sh", cutoff=5.0, max_neighbors=None, drop_path=0.0, alpha_drop=0.2, max_num_elements=90,
)

MODEL_CONFIGS: dict[str, dict] = {
    # EquiformerV2, OC20 S2EF-2M (83M parameters published)
    "equiformer_v2-s2ef-2m": dict(_EQV2_OC20, num_layers=12, lmax=6, mmax=2, drop_path=0.05),
    # EquiformerV2, OC20 S2EF-All+MD (31M)
    "equiformer_v2-31m": dict(_EQV2_OC20, num_layers=8, lmax=4, mmax=2, drop_path=0.1),
    # EquiformerV2, OC20 S2EF-All+MD (153M)
    "equiformer_v2-153m": dict(_EQV2_OC20, num_layers=20, lmax=6, mmax=3, drop_path=0.1),
    # the same shapes with the EST update (our default block: one spherical expert, irreps projections)
    "est-s2ef-2m": dict(_EQV2_OC20, num_layers=12, lmax=6, mmax=2, drop_path=0.05, update="est"),
    "est-31m": dict(_EQV2_OC20, num_layers=8, lmax=4, mmax=2, drop_path=0.1, update="est"),
    # the EST paper code's defaults (est-method.md section 5)
    "est-paper": dict(
        _EQV2_OC20, num_layers=12, lmax=6, mmax=2, channels=128, num_heads=8, attn_hidden_channels=128,
        attn_alpha_channels=32, attn_value_channels=16, ffn_hidden_channels=512, norm="rms_norm_sh",
        cutoff=5.0, num_radial=600, update="est", est=dict(preset="paper"), drop_path=0.05,
    ),
    # QM9 (python train.py +experiment=qm9 / qm9_eqv2): 3.1M / 3.8M parameters with one property head
    "est-qm9": dict(_QM9, update="est"),
    "eqv2-qm9": dict(_QM9, update="ffn"),
    # CPU sizes: seconds per step on 2 cores
    "est-tiny": dict(_TINY, update="est"),
    "eqv2-tiny": dict(_TINY, update="ffn"),
    "spherical-tiny": dict(_TINY, update="spherical"),
    "est-paper-tiny": dict(_TINY, update="est", est=dict(preset="paper")),
    "est-small": dict(_TINY, num_layers=4, lmax=4, channels=64, attn_hidden_channels=64, num_heads=4,
                      attn_alpha_channels=16, attn_value_channels=16, ffn_hidden_channels=128, edge_channels=64,
                      num_radial=64, grid_resolution=(12, 11), update="est"),
    "eqv2-small": dict(_TINY, num_layers=4, lmax=4, channels=64, attn_hidden_channels=64, num_heads=4,
                       attn_alpha_channels=16, attn_value_channels=16, ffn_hidden_channels=128, edge_channels=64,
                       num_radial=64, grid_resolution=(12, 11), update="ffn"),
}


def list_models() -> list[str]:
    """Names of the registered model shapes (:data:`MODEL_CONFIGS`), sorted; pass one to :func:`build_model`."""
    return sorted(MODEL_CONFIGS)


def model_config(name: str, **overrides) -> ModelConfig:
    """The :class:`ModelConfig` of a named shape, with field overrides."""
    if name not in MODEL_CONFIGS:
        raise ValueError(f"unknown model {name!r}; known: {sorted(MODEL_CONFIGS)}")
    values = dict(MODEL_CONFIGS[name])
    check_renamed(overrides)
    unknown = sorted(set(overrides) - set(ModelConfig.field_names()))
    if unknown:
        raise ValueError(f"unknown model config keys {unknown} for {name!r}; valid keys: {ModelConfig.field_names()}")
    if isinstance(overrides.get("est"), Mapping):  # nested: merged into the shape's EST options
        overrides = dict(overrides, est=merge_est(values.get("est") or {}, overrides["est"]))
    values.update(overrides)
    return ModelConfig(**values)


def build_model(name: str = "est-tiny", **overrides) -> EquiformerV2:
    """Build a named model, e.g. ``build_model("est-tiny", regress_forces="gradient")``."""
    return EquiformerV2(model_config(name, **overrides))


def migrate_defaults(d: Mapping, version: int) -> dict:
    """A model config dict (``build_model`` keywords) written under defaults ``version``, pinned to
    what it meant then (``est.models.config.MODEL_DEFAULTS_VERSION``).

    Before version 2 the EST default preset had no bound on its attention
    logits and ``est.logit_cap`` was ``None``; today ``None`` takes the preset's
    4. A config whose update block is the EST default with irreps projections
    (``update`` and ``est`` read through its named shape) gets
    ``est.logit_cap = 0`` (off), so it loads the function it was trained as.
    Other configs, and ``_target_`` models, are returned unchanged.
    """
    out = dict(d)
    if version >= 2 or "_target_" in out:
        return out
    shape = MODEL_CONFIGS.get(out.get("name"), {})
    update = out.get("update", shape.get("update", "ffn"))
    est = dict(out.get("est") or {})
    effective = {**dict(shape.get("est") or {}), **{k: v for k, v in est.items() if v is not None}}
    capped_block = (effective.get("preset", "default") == "default"
                    and effective.get("projections", "irreps") == "irreps")
    if update != "ffn" and capped_block and est.get("logit_cap") is None:
        out["est"] = {**est, "logit_cap": 0.0}
    return out
