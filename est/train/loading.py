"""Trained models from checkpoints: the one loader that the trainer, ``mode=eval``,
the ASE calculator and ``est.testing.check`` share.

A checkpoint (``est.train.checkpoint``) holds the resolved config, the raw
weights, the EMA copy, normalisers, atom references and the training
elements. :func:`load_trained_model` rebuilds the model from the config and
loads :func:`model_state`'s weights; importing this module does not import the
trainer.
"""
from __future__ import annotations

import importlib
from typing import Any, Dict

from omegaconf import DictConfig, OmegaConf
from torch import nn

from .checkpoint import load_checkpoint, resolve_checkpoint_path
from .config import ConfigError, TrainConfig

__all__ = ["build_model_from_config", "model_state", "load_trained_model", "checkpoint_config",
           "checkpoint_model_config"]


def model_dict(model_cfg: Any) -> Dict[str, Any]:
    """``cfg.model`` as a plain dict (OmegaConf resolved)."""
    if isinstance(model_cfg, DictConfig):
        return OmegaConf.to_container(model_cfg, resolve=True)  # type: ignore[return-value]
    return dict(model_cfg)


def build_model_from_config(cfg: Any) -> nn.Module:
    """The model of ``cfg.model``: ``est.models.build_model(**cfg.model)``.

    ``model._target_: package.module.Class`` builds any other ``nn.Module``
    with the remaining keys as keyword arguments instead. Unknown model options
    raise :class:`ConfigError` naming ``model.<key>``.
    """
    m = model_dict(cfg.model if hasattr(cfg, "model") else cfg["model"])
    target = m.pop("_target_", None)
    if target:
        mod_name, _, cls_name = str(target).rpartition(".")
        try:
            factory = getattr(importlib.import_module(mod_name), cls_name)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"model._target_={target!r} cannot be imported ({exc}). Fix: give an importable 'module.Class'.") from None
        label = target
    else:
        try:
            from est.models import build_model as factory  # type: ignore[attr-defined]
        except ImportError as exc:
            raise ConfigError(f"est.models.build_model is not available ({exc}). Fix: install the full est package, "
                              "or set model._target_=your.module.Model.") from None
        label = m.get("name")
        from .config import check_model_keys

        check_model_keys(m | {"name": label})
    try:
        return factory(**m)
    except TypeError as exc:
        text = str(exc)
        for key in m:
            if f"'{key}'" in text and ("unexpected keyword" in text or "got an unexpected" in text):
                raise ConfigError(f"model.{key} is not an option of model {label!r} ({text}). "
                                  f"Fix: remove model.{key} or use one of the model's config fields.") from None
        raise


def model_state(ck: Dict[str, Any], use_ema: bool = True) -> Dict[str, Any]:
    """The weights a checkpoint is evaluated with: the EMA copy when present and ``use_ema``, else the raw ones."""
    ema = ck.get("ema")
    return ema["module"] if (use_ema and isinstance(ema, dict) and "module" in ema) else ck["model"]


def checkpoint_config(ck: Dict[str, Any]):
    """The checkpoint's training config (``TrainConfig`` schema), with its model config as it was
    trained (:func:`checkpoint_model_config`), so old checkpoints keep loading."""
    raw = dict(ck["config"])
    if isinstance(raw.get("model"), dict):
        raw["model"] = checkpoint_model_config(ck, raw["model"])
    return OmegaConf.merge(OmegaConf.structured(TrainConfig), raw)


def checkpoint_model_config(ck: Dict[str, Any], model: Dict[str, Any]) -> Dict[str, Any]:
    """``model`` (a model config dict saved in checkpoint ``ck``) in today's keys and defaults:
    old flat ``est_*`` keys nested into ``est``, and the defaults of the checkpoint's
    ``model_defaults`` version pinned (``est.models.registry.migrate_defaults``)."""
    from est.models.config import migrate_model_keys
    from est.models.registry import migrate_defaults

    return migrate_defaults(migrate_model_keys(model), int(ck.get("model_defaults", 1)))


class IncompatibleOverrides(ValueError):
    """``model_overrides`` that change the shapes of a checkpoint's weights."""


def load_trained_model(path: str, *, map_location: Any = "cpu", use_ema: bool = True,
                       model_overrides: Dict[str, Any] | None = None):
    """Rebuild a trained model from an est.train checkpoint: ``(model in eval mode, checkpoint dict)``.

    The model comes from the checkpoint's resolved ``config["model"]``
    (:func:`build_model_from_config`, so ``model._target_`` works too) with
    :func:`model_state`'s weights. Raises ``ValueError`` for a file that is not
    an est.train checkpoint. ``path`` may be a run folder: its ``best.pt``, else ``last.pt``.

    ``model_overrides``: a nested mapping merged into the model config first, for
    options that keep the weights' shapes, e.g. ``{"est": {"grid": {"degree": 20}}}``:
    the EST default's weights act on irreps coefficients, so the same weights
    sample any design, and a model whose attention sharpened in training aliases
    less on a finer one (``benchmarks/bench_trained_grid.py``).
    :class:`IncompatibleOverrides` (a ``ValueError``) when they change the weights' shapes.
    """
    path = resolve_checkpoint_path(path)
    ck = load_checkpoint(path, map_location=map_location)
    if not isinstance(ck, dict) or "config" not in ck or "model" not in ck:
        keys = sorted(ck) if isinstance(ck, dict) else type(ck).__name__
        raise ValueError(f"{path} is not an est.train checkpoint (needs 'config' and 'model'; has {keys})")
    cfg = checkpoint_config(ck)
    if model_overrides:
        cfg = OmegaConf.merge(cfg, {"model": dict(model_overrides)})
    model = build_model_from_config(cfg)
    try:
        model.load_state_dict(model_state(ck, use_ema))
    except RuntimeError as err:
        if not model_overrides:
            raise
        first = str(err).strip().splitlines()[-1].strip()
        raise IncompatibleOverrides(
            f"model_overrides={model_overrides} change the shapes of {path}'s weights ({first}). Fix: override only "
            "options the weights do not depend on, e.g. {'est': {'grid': {'degree': 20}}}") from None
    return model.eval(), ck
