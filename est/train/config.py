"""Structured (validated) training configuration and Hydra composition.

The config tree has four groups that map 1:1 to the YAML folders in
``configs/``::

    model:   free mapping passed to ``est.models.build_model(**model)``
             (or ``_target_: pkg.Class`` for any other ``nn.Module``)
    data:    :class:`DataConfig`
    trainer: :class:`TrainerConfig`
    (root)   :class:`TrainConfig`: run_dir, seed, mode, ckpt, name

The dataclasses are registered in Hydra's ConfigStore as ``base_config`` and
every YAML file is merged onto them, so a misspelt key
(``trainer.lrr=1e-3``) fails at composition. :func:`load_config` turns every
composition or validation failure into one :class:`ConfigError` whose message
names the key, the closest valid keys and the fix. :func:`validate` checks
choices, ranges, option compatibility and that data paths exist.

``data.batch_size`` is the *global* batch (summed over DDP ranks), so one
recipe means the same optimisation on 1 or many processes.
"""
from __future__ import annotations

import difflib
import math
import os
from dataclasses import MISSING as _DC_MISSING, dataclass, field, fields, is_dataclass
from typing import Any, Dict, List, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

__all__ = [
    "ConfigError", "DataConfig", "TrainerConfig", "NormalizerConfig", "TrainConfig",
    "register_configs", "load_config", "validate", "validate_numbers", "default_config_dir", "to_container",
    "TASKS", "QM9_TARGETS",
]

TASKS = ("qm9", "s2ef", "is2re")
#: modules that build a dataset on first use (``data.generate``)
GENERATORS = ("est.data.generate", "est.data.xtb")
#: PyG's 19 QM9 targets (index -> name), the order of ``sample.y``
QM9_TARGETS = (
    "mu", "alpha", "homo", "lumo", "gap", "r2", "zpve", "U0", "U", "H", "G", "cv",
    "U0_atom", "U_atom", "H_atom", "G_atom", "A", "B", "C",
)


class ConfigError(ValueError):
    """A configuration problem; the message names the key and the fix."""


@dataclass(kw_only=True)
class DataConfig:
    """Where the data come from and how they are batched."""

    #: "qm9" (molecular properties), "s2ef" (energy + forces), "is2re" (relaxed energy)
    task: str = "qm9"
    # -- QM9
    #: QM9 source: a PyG root/raw folder, an xyz tarball/folder or a folder of
    #: qm9pack CSVs; null = the installed ``qm9pack`` package
    root: Optional[str] = None
    #: "auto" | "qm9pack" | "pyg" | "xyz"
    source: str = "auto"
    #: PyG target indices to learn (0..18); U0/U/H/G (7-10) use atom references
    targets: List[int] = field(default_factory=lambda: [7])
    #: per-element energy references the model learns on top of: "fit" (least squares on the
    #: training split; QM9 U0/U/H/G, S2EF and IS2RE energies), "b3lyp" (QM9's free-atom
    #: energies, QM9 only) or "none"
    atomref: str = "fit"
    split_seed: int = 0
    cache_dir: Optional[str] = None
    # -- files: OC20-layout LMDB (s2ef: folder of *.lmdb; is2re: data.lmdb), fairchem .aselmdb
    # (a file or a folder of them), ASE .db/.json
    train_path: Optional[str] = None
    val_path: Optional[str] = None
    test_path: Optional[str] = None
    #: sample field -> record key(s), e.g. {energy: y_relaxed}
    key_map: Dict[str, Any] = field(default_factory=dict)
    #: unpickle LMDB records without the allow-list (only for files you trust)
    trusted: bool = False
    #: when ``val_path`` is null: hold out the last ``val_fraction`` of the training set (in file order)
    #: for validation. A contiguous tail, not a random draw: neighbouring frames of an MD trajectory are
    #: correlated, and a random hold-out would score interpolation between training frames
    val_fraction: Optional[float] = None
    #: build the set into ``generate_dir`` when train_path is missing, with ``python -m <generator> --out
    #: generate_dir <generate_args>``: ``est.data.generate`` (the EMT OC20-layout set) or ``est.data.xtb``
    #: (GFN2-xTB molecular dynamics; needs tblite)
    generate: bool = False
    generator: str = "est.data.generate"
    generate_dir: Optional[str] = None
    generate_args: List[str] = field(default_factory=list)
    # -- common
    #: keep a deterministic part of every split: a count (> 1, of the whole
    #: dataset for QM9, of the training set for LMDB) or a fraction (<= 1)
    subset: Optional[float] = None
    #: global batch size (summed over all ranks)
    batch_size: int = 32
    eval_batch_size: Optional[int] = None
    num_workers: int = 0
    #: "balanced" (split global batches across ranks by atom count) or "even"
    sampler: str = "balanced"
    shuffle: bool = True


@dataclass(kw_only=True)
class NormalizerConfig:
    """Target normalisation: fitted on training data unless given."""

    fit: bool = True
    #: random training samples read to fit S2EF/IS2RE energy references and normalisers
    #: (QM9 uses all targets, which are in memory)
    max_samples: int = 20000
    energy_mean: Optional[float] = None
    energy_std: Optional[float] = None


@dataclass(kw_only=True)
class TrainerConfig:
    """Optimisation, evaluation, checkpointing and logging."""

    max_epochs: int = 1
    #: stop after this many optimiser steps (whichever of max_epochs/max_steps comes first)
    max_steps: Optional[int] = None
    lr: float = 5e-4
    weight_decay: float = 0.0
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    #: linear warmup length in epochs (EquiformerV2: 0.1) or, if set, in steps
    warmup_epochs: float = 0.0
    warmup_steps: Optional[int] = None
    warmup_factor: float = 0.2
    lr_min_factor: float = 0.01
    #: gradient clipping by global norm; null disables
    clip_grad_norm: Optional[float] = 100.0
    #: EMA decay of weights used for evaluation; null disables
    ema_decay: Optional[float] = 0.999
    #: bf16 autocast (only on GPU; CPU always runs fp32)
    amp: bool = True
    #: lambda_E, lambda_F
    energy_coefficient: float = 1.0
    force_coefficient: float = 100.0
    #: evaluate on val every N steps (null: at the end of every epoch)
    eval_every: Optional[int] = None
    log_every: int = 50
    #: also write last.pt every N steps (null: only at evaluations and at the end)
    save_every: Optional[int] = None
    #: metric deciding best.pt (lower is better); null: the task's primary metric
    monitor: Optional[str] = None
    #: "auto" (resume from run_dir/last.pt if present), "never", or a checkpoint path
    resume: str = "auto"
    #: batches with non-finite inputs (positions, cells, targets) or a non-finite loss / gradient
    #: tolerated (skipped on every rank, named in the log) before the run stops
    max_bad_batches: int = 0
    #: "auto" (cuda:LOCAL_RANK if available), "cpu", "cuda"
    device: str = "auto"
    progress: bool = True
    tensorboard: bool = True
    plots: bool = True
    #: splits evaluated with the best weights when training ends
    final_splits: List[str] = field(default_factory=lambda: ["val", "test"])
    #: keep autograd on during evaluation (needed by gradient-force models;
    #: null: on when model.regress_forces == "gradient")
    grad_in_eval: Optional[bool] = None
    #: prefetch the next batch in a background thread (CPU) / side stream (GPU)
    prefetch: bool = True
    #: time per epoch printed at start-up (est.train.epoch_time): steps timed after
    #: epoch_time_warmup untimed ones (>= 1); 0 disables
    epoch_time_steps: int = 5
    epoch_time_warmup: int = 2
    find_unused_parameters: bool = False
    #: CPU runs: keep freed memory in the process (glibc: no mmap for large blocks, no heap trimming), so the
    #: step's large temporaries stop page-faulting every step (est.train.malloc; timed by
    #: benchmarks/bench_cpu_malloc.py); the process keeps its peak memory
    keep_freed_memory: bool = False
    normalizer: NormalizerConfig = field(default_factory=NormalizerConfig)


@dataclass(kw_only=True)
class TrainConfig:
    """Root of the configuration."""

    model: Dict[str, Any] = field(default_factory=dict)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    #: experiment name (set by the experiment files)
    name: str = "default"
    #: checkpoints, metrics CSV and plots go here
    run_dir: str = "runs/${name}"
    seed: int = 0
    #: "train" or "eval" (metrics + predictions of ``ckpt`` on ``eval_splits``)
    mode: str = "train"
    ckpt: Optional[str] = None
    eval_splits: List[str] = field(default_factory=lambda: ["val"])


_REGISTERED = False


def register_configs() -> None:
    """Register the schema in Hydra's ConfigStore (idempotent)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="base_config", node=TrainConfig)
    _REGISTERED = True


def default_config_dir() -> str:
    """``configs/`` of the source tree (next to ``train.py``), or ``$EST_CONFIG_DIR``."""
    env = os.environ.get("EST_CONFIG_DIR")
    if env:
        return os.path.abspath(env)
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.abspath(os.path.join(here, "..", "..", "configs"))


# ----------------------------------------------------------------------------- errors
def _schema_node(path: Sequence[str]) -> Any:
    """The dataclass type at ``path`` of the schema (None for free-form nodes like ``model``)."""
    node: Any = TrainConfig
    for part in path:
        if not is_dataclass(node):
            return None
        f = {x.name: x for x in fields(node)}.get(part)
        if f is None:
            return None
        default = f.default_factory() if f.default_factory is not _DC_MISSING else f.default
        node = type(default) if is_dataclass(default) else None
    return node


def _valid_keys(parent: Sequence[str]) -> List[str]:
    node = _schema_node(parent)
    if node is None or not is_dataclass(node):
        return []
    return [f.name for f in fields(node)]


def _unknown_key_message(full_key: str, override: Optional[str] = None) -> str:
    parts = [p for p in full_key.split(".") if p]
    parent, key = parts[:-1], parts[-1] if parts else full_key
    valid = _valid_keys(parent)
    where = ".".join(parent) or "the root"
    msg = f"unknown config key '{full_key}'"
    close = difflib.get_close_matches(key, valid, n=3, cutoff=0.5)
    if close:
        prefix = ".".join(parent) + "." if parent else ""
        msg += f": did you mean {', '.join(repr(prefix + c) for c in close)}?"
    if valid:
        msg += f" Valid keys of {where}: {', '.join(valid)}."
    msg += " Fix: correct the spelling in your override or YAML file (model options go under 'model.')."
    return msg


def _explain(exc: BaseException, overrides: Sequence[str]) -> str:
    """Turn a Hydra/OmegaConf composition error into a message with the key and the fix."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    chain = []
    e: Optional[BaseException] = exc
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    for e in chain:
        full_key = getattr(e, "full_key", None)
        if isinstance(e, (ConfigKeyError, ConfigAttributeError)) and full_key:
            return _unknown_key_message(str(full_key))
        if isinstance(e, ValidationError) and full_key:
            first = str(getattr(e, 'msg', e)).strip().splitlines()[0]
            return (f"invalid value for config key '{full_key}': {first}. "
                    f"Fix: give '{full_key}' a value of the documented type.")
    text = "; ".join(str(e).strip().splitlines()[0] for e in chain if str(e).strip())
    if "Could not find" in text or "not found" in text:
        return text + " Fix: check the group and option name (ls configs/<group>/); experiments are selected with +experiment=NAME."
    return text or repr(exc)


def load_config(overrides: Sequence[str] = (), *, config_dir: Optional[str] = None,
                config_name: str = "config", check: bool = True) -> DictConfig:
    """Compose ``configs/<config_name>.yaml`` with command-line style ``overrides``.

    Raises :class:`ConfigError` (naming the key and the fix) on unknown keys,
    bad values, missing data paths or incompatible options.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_configs()
    config_dir = os.path.abspath(config_dir or default_config_dir())
    if not os.path.isdir(config_dir):
        raise ConfigError(f"config folder {config_dir} does not exist. Fix: run from the repository or set EST_CONFIG_DIR.")
    # model.* is free-form (the model's own config dataclass validates it), so
    # `model.lmax=4` means add-or-override: Hydra spells that `++model.lmax=4`
    overrides = ["++" + o if o.startswith("model.") else o for o in overrides]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
            cfg = compose(config_name=config_name, overrides=list(overrides))
    except ConfigError:
        raise
    except Exception as exc:  # hydra / omegaconf errors
        raise ConfigError(_explain(exc, overrides)) from None
    finally:
        GlobalHydra.instance().clear()
    try:
        OmegaConf.resolve(cfg)
    except Exception as exc:
        raise ConfigError(f"cannot resolve interpolations: {exc}") from None
    check_unknown_keys(cfg)
    if check:
        validate(cfg)
    return cfg


def check_unknown_keys(cfg: Any) -> None:
    """Raise :class:`ConfigError` for keys the schema does not have.

    Hydra lets ``+group.key=value`` add keys even to structured configs; this
    catches those too.
    """
    def walk(node: Any, schema: Any, path: List[str]) -> None:
        names = {f.name for f in fields(schema)}
        for key in node.keys():
            if key not in names:
                raise ConfigError(_unknown_key_message(".".join(path + [str(key)])))
            sub = _schema_node(path + [str(key)])
            if sub is not None and isinstance(node[key], (dict, DictConfig)):
                walk(node[key], sub, path + [str(key)])

    walk(cfg, TrainConfig, [])


def to_container(cfg: Any) -> Dict[str, Any]:
    """The resolved config as plain python types (for checkpoints)."""
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    return cfg


# ----------------------------------------------------------------------------- validation
def _choice(key: str, value: Any, choices: Sequence[Any]) -> None:
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not valid. Fix: choose one of {', '.join(map(repr, choices))}.")


def _positive(key: str, value: Any, *, allow_none: bool = False, allow_zero: bool = False) -> None:
    """``value`` must be a finite number > 0 (``>= 0`` with ``allow_zero``; ``None`` with ``allow_none``).

    NaN and inf are refused: ``nan < 0`` is False, so a plain comparison lets them through.
    """
    if value is None and allow_none:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{key}={value!r} must be a finite number {'>= 0' if allow_zero else '> 0'}. "
                          f"Fix: set {key} to a positive number" + (" or null." if allow_none else "."))


def _finite(key: str, value: Any) -> None:
    if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value)):
        raise ConfigError(f"{key}={value!r} must be a finite number. Fix: give a number or null.")


def validate_numbers(cfg: Any) -> None:
    """Ranges of every number of ``data`` and ``trainer`` (no file access; the Trainer calls it too).

    Catches NaN / inf / negative learning rates, batch sizes, coefficients,
    betas, decays and normaliser values before any data is read.
    """
    d, t = cfg.data, cfg.trainer
    _positive("data.batch_size", d.batch_size)
    _positive("data.eval_batch_size", d.eval_batch_size, allow_none=True)
    _positive("data.num_workers", d.num_workers, allow_zero=True)
    _positive("data.subset", d.subset, allow_none=True)
    if d.val_fraction is not None and not (isinstance(d.val_fraction, (int, float)) and 0.0 < d.val_fraction < 1.0):
        raise ConfigError(f"data.val_fraction={d.val_fraction!r} must be a fraction in (0, 1). "
                          "Fix: e.g. data.val_fraction=0.05, or null with a data.val_path.")
    _positive("trainer.max_epochs", t.max_epochs)
    _positive("trainer.max_steps", t.max_steps, allow_none=True)
    _positive("trainer.lr", t.lr)
    _positive("trainer.weight_decay", t.weight_decay, allow_zero=True)
    _positive("trainer.clip_grad_norm", t.clip_grad_norm, allow_none=True)
    _positive("trainer.log_every", t.log_every)
    _positive("trainer.eval_every", t.eval_every, allow_none=True)
    _positive("trainer.save_every", t.save_every, allow_none=True)
    _positive("trainer.max_bad_batches", t.max_bad_batches, allow_zero=True)
    _positive("trainer.epoch_time_steps", t.epoch_time_steps, allow_zero=True)
    _positive("trainer.epoch_time_warmup", t.epoch_time_warmup)
    _positive("trainer.warmup_epochs", t.warmup_epochs, allow_zero=True)
    _positive("trainer.warmup_steps", t.warmup_steps, allow_none=True, allow_zero=True)
    _positive("trainer.energy_coefficient", t.energy_coefficient, allow_zero=True)
    _positive("trainer.force_coefficient", t.force_coefficient, allow_zero=True)
    _positive("trainer.normalizer.max_samples", t.normalizer.max_samples)
    _positive("trainer.normalizer.energy_std", t.normalizer.energy_std, allow_none=True)
    _finite("trainer.normalizer.energy_mean", t.normalizer.energy_mean)
    if d.task != "qm9" and t.energy_coefficient == 0 and (d.task == "is2re" or t.force_coefficient == 0):
        raise ConfigError(f"trainer.energy_coefficient=0{'' if d.task == 'is2re' else ' and trainer.force_coefficient=0'}: "
                          f"the data.task={d.task} loss is identically 0. Fix: set trainer.energy_coefficient > 0.")
    if t.ema_decay is not None and not 0.0 < t.ema_decay < 1.0:
        raise ConfigError(f"trainer.ema_decay={t.ema_decay} must be in (0, 1). Fix: e.g. 0.999, or null to disable EMA.")
    if not 0.0 <= t.warmup_factor <= 1.0 or not 0.0 <= t.lr_min_factor <= 1.0:
        raise ConfigError("trainer.warmup_factor and trainer.lr_min_factor must be in [0, 1]. Fix: e.g. 0.2 and 0.01 (EquiformerV2).")
    if len(t.betas) != 2 or not all(isinstance(b, (int, float)) and 0.0 <= b < 1.0 for b in t.betas):
        raise ConfigError(f"trainer.betas={list(t.betas)} must be two numbers in [0, 1). Fix: e.g. trainer.betas=[0.9,0.999].")


def validate(cfg: Any, *, check_paths: bool = True) -> None:
    """Check choices, ranges, option compatibility and data paths (see module docstring)."""
    d, t, m = cfg.data, cfg.trainer, cfg.model
    _choice("data.task", d.task, TASKS)
    _choice("mode", cfg.mode, ("train", "eval"))
    _choice("data.sampler", d.sampler, ("balanced", "even"))
    _choice("data.generator", d.generator, GENERATORS)
    _choice("trainer.device", t.device, ("auto", "cpu", "cuda"))
    validate_numbers(cfg)
    if t.resume not in ("auto", "never") and cfg.mode == "train" and check_paths and not os.path.isfile(t.resume):
        raise ConfigError(f"trainer.resume={t.resume!r}: no such checkpoint file. Fix: give an existing .pt file, 'auto' or 'never'.")
    for s in list(t.final_splits) + list(cfg.eval_splits):
        _choice("trainer.final_splits / eval_splits entry", s, ("train", "val", "test"))
    if not isinstance(m, (dict, DictConfig)) or (not m.get("name") and not m.get("_target_")):
        raise ConfigError("model has no 'name'. Fix: select a model preset (model=est_tiny, ls configs/model) "
                          "or set model.name=est-tiny.")

    check_model_keys(m)
    regress = m.get("regress_forces")
    if d.task == "qm9":
        if d.val_fraction is not None:
            raise ConfigError("data.val_fraction is for file datasets; QM9 has its standard validation split. "
                              "Fix: data.val_fraction=null.")
        bad = [x for x in d.targets if not (isinstance(x, int) and 0 <= x < 19)]
        if bad or len(d.targets) == 0:
            raise ConfigError(f"data.targets={list(d.targets)} must be a non-empty list of PyG QM9 target indices 0..18. "
                              f"Fix: pick from {', '.join(f'{i}={n}' for i, n in enumerate(QM9_TARGETS))}, e.g. data.targets=[4].")
        if len(set(d.targets)) != len(d.targets):
            raise ConfigError(f"data.targets={list(d.targets)} has duplicates. Fix: list each target once.")
        _choice("data.atomref", d.atomref, ("b3lyp", "fit", "none"))
        _choice("data.source", d.source, ("auto", "qm9pack", "pyg", "xyz"))
        nt = m.get("num_targets")
        if nt is not None and nt != len(d.targets):
            raise ConfigError(f"model.num_targets={nt} but data.targets has {len(d.targets)} entries. "
                              f"Fix: set model.num_targets={len(d.targets)}.")
        if regress:
            raise ConfigError(f"model.regress_forces={regress!r} is incompatible with data.task=qm9 (no forces). "
                              "Fix: set model.regress_forces=null.")
        if check_paths and d.root is not None and not os.path.exists(d.root):
            raise ConfigError(f"data.root={d.root!r} does not exist. Fix: point data.root at a QM9 source "
                              "(PyG raw folder, dsgdb9nsd.xyz.tar.bz2, qm9pack CSV folder) or set data.root=null "
                              "to use the installed qm9pack package (pip install qm9pack).")
    else:
        if d.atomref == "b3lyp":
            raise ConfigError(f"data.atomref=b3lyp is QM9's table of free-atom energies; data.task={d.task} has none. "
                              "Fix: data.atomref=fit (least-squares references on the training set) or none.")
        _choice("data.atomref", d.atomref, ("fit", "none"))
        if d.atomref == "fit" and (t.normalizer.energy_mean is not None or t.normalizer.energy_std is not None):
            raise ConfigError("data.atomref=fit with fixed trainer.normalizer.energy_mean/energy_std: the fixed values "
                              "would apply to the energies minus fitted references. Fix: data.atomref=none to keep "
                              "them (e.g. published normalisers of raw energies), or set both to null to fit them.")
        if d.task == "s2ef" and not regress and t.force_coefficient > 0:
            raise ConfigError("data.task=s2ef trains forces but model.regress_forces is not set. "
                              "Fix: set model.regress_forces=direct (or gradient), or trainer.force_coefficient=0.")
        if d.task == "is2re" and regress:
            raise ConfigError(f"model.regress_forces={regress!r} is incompatible with data.task=is2re (relaxed energies only). "
                              "Fix: set model.regress_forces=null.")
        if d.val_fraction is not None and d.val_path is not None:
            raise ConfigError(f"data.val_fraction={d.val_fraction} and data.val_path={d.val_path!r} both give a validation "
                              "set. Fix: data.val_path=null to hold out part of the training set, or data.val_fraction=null.")
        if check_paths:
            needed = [] if d.val_fraction is not None else [("data.val_path", d.val_path)]
            if cfg.mode == "train":
                needed.insert(0, ("data.train_path", d.train_path))
            for key, p in needed:
                if p is None:
                    if key == "data.train_path" and d.generate:
                        continue
                    raise ConfigError(f"{key} is not set. Fix: pass {key}=/path/to/{'folder of *.lmdb' if d.task == 's2ef' else 'data.lmdb'}"
                                      " (or an .aselmdb file / folder of them) on the command line.")
                if not os.path.exists(p) and not (d.generate and key in ("data.train_path", "data.val_path")):
                    raise ConfigError(f"{key}={p!r} does not exist. Fix: pass {key}=<existing .lmdb/.aselmdb file or folder>"
                                      + (" or data.generate=true to build a generated set there." if d.task != "qm9" else "."))
            if d.test_path is not None and not os.path.exists(d.test_path) and not d.generate:
                raise ConfigError(f"data.test_path={d.test_path!r} does not exist. Fix: give an existing path or data.test_path=null.")
    if cfg.mode == "eval" and check_paths:
        ckpt = cfg.ckpt or os.path.join(cfg.run_dir, "best.pt")
        if os.path.isdir(ckpt):
            raise ConfigError(f"ckpt={ckpt} is a folder, not a checkpoint file. Fix: pass ckpt={os.path.join(ckpt, 'best.pt')} "
                              f"(or last.pt), or run_dir={ckpt} without ckpt.")
        if not os.path.isfile(ckpt):
            raise ConfigError(f"mode=eval needs a checkpoint, but {ckpt} does not exist. Fix: pass ckpt=/path/to/best.pt "
                              "or the run_dir of a finished run.")


def check_model_keys(model_cfg: Any) -> None:
    """Unknown ``model.*`` keys fail here, against ``est.models.ModelConfig`` (skipped for ``model._target_``)."""
    if model_cfg.get("_target_"):
        return
    try:
        from est.models import ModelConfig  # type: ignore[attr-defined]
        from est.models.config import ESTOptions, check_renamed

        valid = set(ModelConfig.field_names())
    except Exception:  # models not importable: build_model will complain
        return
    try:
        check_renamed(list(model_cfg))
        if model_cfg.get("est") is not None:
            ESTOptions.from_any(to_container(model_cfg["est"]) if not isinstance(model_cfg["est"], dict) else model_cfg["est"])
    except ValueError as exc:
        raise ConfigError(f"{exc}. Fix: use the nested names, e.g. model.est.preset=paper model.est.grid.degree=24.") from None
    for key in model_cfg:
        if key != "name" and key not in valid:
            close = difflib.get_close_matches(str(key), sorted(valid), n=3, cutoff=0.5)
            hint = f" Did you mean {', '.join('model.' + c for c in close)}?" if close else ""
            raise ConfigError(f"unknown model option 'model.{key}'.{hint} "
                              f"Fix: remove it or use one of: {', '.join(sorted(valid))}.")
