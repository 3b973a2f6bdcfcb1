"""The backbone's configuration: one keyword-only dataclass (Hydra maps 1:1)."""
from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

from ..nn.grid import check_positive

__all__ = ["ModelConfig", "ESTOptions", "GridOptions", "UPDATES", "FORCE_MODES", "RENAMED_KEYS", "check_renamed",
           "migrate_model_keys", "MODEL_DEFAULTS_VERSION"]

UPDATES = ("ffn", "est", "spherical")
FORCE_MODES = ("direct", "gradient", None)
MESSAGE_ACTIVATIONS = ("s2", "gate")


@dataclass(kw_only=True)
class GridOptions:
    """A sphere grid of the EST block; ``None`` keeps the preset's value (``est.nn.GridConfig`` fields)."""

    kind: str | None = None
    num_points: int | None = None
    degree: int | None = None
    normalization: str | None = None


@dataclass(kw_only=True)
class ESTOptions:
    """The EST update block's options inside :class:`ModelConfig` (``model.est.*``).

    ``None`` takes the value of ``preset`` (``"default"``: ours, ``"paper"``: the
    released module; see :func:`est.nn.preset_config`). ``grid``: the spherical
    Transformer's points; ``steerable_grid``: the steerable (FFN) experts' grid
    (for ``update="ffn"`` and the paper preset the model's ``grid_resolution``
    equiangular grid, as EquiformerV2). Hydra: ``model.est.preset=paper``,
    ``model.est.grid.degree=24``. ``logit_cap``: the bound on the spherical
    Transformer's attention logits; ``None`` keeps the preset's (default: 4,
    paper: none), ``0`` turns it off (``model.est.logit_cap=0``). ``value_skip``:
    add each point's value to its attention output (``model.est.value_skip=true``;
    off in both presets; see :mod:`est.nn.spherical_transformer`, step 5).
    """

    preset: str = "default"
    num_steerable_experts: int | None = None
    num_spherical_experts: int | None = None
    num_heads: int | None = None
    encoding: str | None = None
    mlp_ratio: int | None = None
    projections: str | None = None
    logit_cap: float | None = None  # None: the preset's (default: 4, paper: off); 0: off
    value_skip: bool | None = None  # None: the preset's (off): each point's value added to its attention output
    grid_rotation: bool | None = None
    grid: GridOptions = dataclasses.field(default_factory=GridOptions)
    steerable_grid: GridOptions = dataclasses.field(default_factory=GridOptions)

    def __post_init__(self) -> None:
        if self.logit_cap is not None and not self.logit_cap >= 0:
            raise ValueError(f"model.est.logit_cap must be >= 0 (0: off) or None (the preset's), "
                             f"got {self.logit_cap!r}")

    @classmethod
    def from_any(cls, value) -> "ESTOptions":
        """An :class:`ESTOptions` from itself or a (nested) mapping; unknown keys name the valid ones."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(f"model.est must be a mapping of EST options, got {type(value).__name__}")
        d = dict(value)
        _check_keys(d, cls, "model.est")
        for key in ("grid", "steerable_grid"):
            if key in d and not isinstance(d[key], GridOptions):
                g = dict(d[key] or {})
                _check_keys(g, GridOptions, f"model.est.{key}")
                d[key] = GridOptions(**g)
        return cls(**d)


def _check_keys(d: Mapping, cls, where: str) -> None:
    valid = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(d) - set(valid))
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(f'{where}.{k}' for k in unknown)}; valid: {valid}")


#: the flat keys of est < 0.2 -> their nested names (a clear error, and checkpoint migration)
RENAMED_KEYS = {
    "est_preset": "est.preset", "est_num_steerable_experts": "est.num_steerable_experts",
    "est_num_spherical_experts": "est.num_spherical_experts", "est_num_heads": "est.num_heads",
    "est_encoding": "est.encoding", "est_mlp_ratio": "est.mlp_ratio", "est_grid_rotation": "est.grid_rotation",
    "est_grid_kind": "est.grid.kind", "est_grid_num_points": "est.grid.num_points",
    "est_grid_degree": "est.grid.degree", "est_grid_normalization": "est.grid.normalization",
}


def check_renamed(keys) -> None:
    """Raise naming the new key for any flat ``est_*`` key of older versions."""
    old = [k for k in keys if k in RENAMED_KEYS]
    if old:
        raise ValueError("renamed model options: " + ", ".join(f"{k} -> {RENAMED_KEYS[k]} (e.g. model.{RENAMED_KEYS[k]}=...)"
                                                            for k in old))


def merge_est(base, changes: Mapping) -> ESTOptions:
    """``base`` EST options (or mapping) updated by a nested mapping of ``changes``."""
    d = dataclasses.asdict(ESTOptions.from_any(base))
    for key, value in dict(changes).items():
        if key in ("grid", "steerable_grid") and isinstance(value, Mapping):
            d[key] = {**d[key], **dict(value)}
        else:
            d[key] = value
    return ESTOptions.from_any(d)


def migrate_model_keys(d: Mapping) -> dict:
    """A model config dict with old flat ``est_*`` keys moved into ``est`` (loading old checkpoints)."""
    out = {k: v for k, v in d.items() if k not in RENAMED_KEYS}
    est = dict(out.get("est") or {})
    for old, new in RENAMED_KEYS.items():
        if old in d and d[old] is not None:
            path = new.split(".")[1:]
            node = est
            for p in path[:-1]:
                node = node.setdefault(p, {})
            node[path[-1]] = d[old]
    if est:
        out["est"] = est
    return out


#: the version of the presets' defaults; checkpoints record it (``"model_defaults"``).
#: 1: no bound on the EST default's attention logits; 2: the default preset bounds them by 4.
#: ``est.models.registry.migrate_defaults`` pins an older config to what it meant then.
MODEL_DEFAULTS_VERSION = 2


@dataclass(kw_only=True)
class ModelConfig:
    """EquiformerV2-style backbone with a replaceable update block, and its heads.

    Shape (EquiformerV2 OC20 S2EF-2M defaults): ``num_layers`` blocks of
    SO(2) graph attention followed by the update; features ``[N, (L+1)^2, C]``.

    update: ``"ffn"`` (EquiformerV2's feed-forward network), ``"est"`` (the EST
    block of ``est.preset``: our default is one spherical Transformer expert with
    irreps projections; ``"paper"`` the released hybrid), ``"spherical"``
    (spherical experts only).
    est: the EST block's options (:class:`ESTOptions`; a mapping is converted):
    ``est.preset`` (``"default"``: ours, ``"paper"``: the released module), its
    grids ``est.grid`` / ``est.steerable_grid``, experts, heads, encoding.
    avg_num_nodes / avg_degree: dataset statistics (OC20: 77.81 / 23.39);
    set them from your data (``est.data`` computes them).
    message_activation: the nonlinearity between the message block's two SO(2)
    convolutions: ``"s2"`` (EquiformerV2's separable S2 activation, sampled on a
    ``grid_resolution`` grid for every edge) or
    ``"gate"`` (SiLU on l = 0, sigmoid gates on l > 0: no grid, exact equivariance;
    fairchem's ``use_gate_act``, but for the message block only).
    regress_forces: ``"direct"`` (EquiformerV2's force head), ``"gradient"``
    (``-dE/dx``, energy conserving; use ``envelope="polynomial"``), or ``None``.
    regress_stress: stress ``(1/V) dE/d strain`` for periodic cells (needs gradient forces).
    num_targets: > 0 adds a ``"properties"`` head with that many invariant scalars per graph (QM9).
    """

    # shape
    num_layers: int = 12
    lmax: int = 6
    mmax: int = 2
    channels: int = 128
    attn_hidden_channels: int = 64
    num_heads: int = 8
    attn_alpha_channels: int = 64
    attn_value_channels: int = 16
    ffn_hidden_channels: int = 128
    edge_channels: int = 128
    max_num_elements: int = 90
    use_atom_edge_embedding: bool = True
    norm: str = "layer_norm_sh"
    grid_resolution: tuple[int, int] = (18, 18)
    # the message block's activation: "s2" (EquiformerV2's separable S2 activation, sampled on the
    # grid_resolution grid per edge) or "gate" (scalar gates on l > 0: no grid, exactly equivariant;
    # fairchem's use_gate_act, here for the message block only: update="ffn" keeps its grid MLP)
    message_activation: str = "s2"
    # graph
    cutoff: float = 12.0
    max_neighbors: int | None = 20
    # "include" keeps every neighbour tied with the max_neighbors-th (within 1e-4 A):
    # rotation invariant; "strict" keeps exactly max_neighbors, breaking ties by
    # a Cartesian key, which depends on the orientation (est.geometry.radius_graph)
    neighbor_tie_mode: str = "include"
    # turn every edge frame by a random angle about its axis at every training call
    # (fairchem's EquiformerV2 does; an augmentation of the SO(2)/grid aliasing). Eval is never rolled.
    edge_roll: bool = False
    use_pbc: bool = True
    num_radial: int = 600
    radial_width_factor: float = 2.0
    envelope: str | None = None
    # initialisation (est.models.init): "eqv2" (EquiformerV2's published configs: PyTorch's uniform
    # weights, zero biases), "eqv2-normal" (fairchem's class default: N(0, 1/fan_in) weights), "torch"
    weight_init: str = "torch"
    # regularisation
    drop_path: float = 0.05
    alpha_drop: float = 0.1
    # update block
    update: str = "ffn"
    est: ESTOptions = dataclasses.field(default_factory=ESTOptions)
    # dataset statistics
    avg_num_nodes: float = 77.81
    avg_degree: float = 23.39
    # heads
    energy_reduce: str = "sum"
    regress_energy: bool = True
    regress_forces: str | None = "direct"
    regress_stress: bool = False
    num_targets: int = 0
    property_reduce: str = "sum"

    def __post_init__(self) -> None:
        check_positive(
            self,
            ("num_layers", "channels", "attn_hidden_channels", "num_heads", "attn_alpha_channels",
             "attn_value_channels", "ffn_hidden_channels", "edge_channels", "num_radial"),
            owner="ModelConfig",
        )
        if isinstance(self.max_num_elements, bool) or not isinstance(self.max_num_elements, int) or self.max_num_elements < 2:
            raise ValueError(
                f"ModelConfig.max_num_elements must be an integer >= 2, got {self.max_num_elements!r}: it is the size "
                "of the element table indexed by atomic number, so use 1 + the largest Z in your data "
                "(EquiformerV2: 90)"
            )
        if not self.cutoff > 0:
            raise ValueError(f"ModelConfig.cutoff must be > 0 (Angstrom), got {self.cutoff!r}")
        if self.message_activation not in MESSAGE_ACTIVATIONS:
            raise ValueError(f"ModelConfig.message_activation must be one of {MESSAGE_ACTIVATIONS}, "
                             f"got {self.message_activation!r}")
        if self.update not in UPDATES:
            raise ValueError(f"ModelConfig.update must be one of {UPDATES}, got {self.update!r}")
        if self.regress_forces not in FORCE_MODES:
            raise ValueError(f"ModelConfig.regress_forces must be one of {FORCE_MODES}, got {self.regress_forces!r}")
        if self.regress_stress and self.regress_forces != "gradient":
            raise ValueError("regress_stress needs regress_forces='gradient' (stress is a strain derivative of the energy)")
        if not 0 <= self.mmax <= self.lmax:
            raise ValueError(f"ModelConfig: mmax must be in 0..lmax={self.lmax}, got {self.mmax}")
        for name in ("energy_reduce", "property_reduce"):
            if getattr(self, name) not in ("sum", "mean"):
                raise ValueError(f"ModelConfig.{name} must be 'sum' or 'mean', got {getattr(self, name)!r}")
        if self.weight_init not in ("eqv2", "eqv2-normal", "torch"):
            raise ValueError(
                f"ModelConfig.weight_init must be 'eqv2', 'eqv2-normal' or 'torch', got {self.weight_init!r}"
            )
        if self.neighbor_tie_mode not in ("include", "strict"):
            raise ValueError(f"ModelConfig.neighbor_tie_mode must be 'include' or 'strict', got {self.neighbor_tie_mode!r}")
        if self.avg_num_nodes <= 0 or self.avg_degree <= 0:
            raise ValueError("ModelConfig: avg_num_nodes and avg_degree must be > 0 (dataset statistics)")
        self.grid_resolution = tuple(self.grid_resolution)
        self.est = ESTOptions.from_any(self.est)
        if self.regress_forces == "gradient" and (self.envelope is None or self.max_neighbors is not None):
            warnings.warn(
                "regress_forces='gradient' with "
                + ("envelope=None" if self.envelope is None else f"max_neighbors={self.max_neighbors}")
                + ": the energy is not continuous where neighbours enter the cutoff or the neighbour list is "
                "truncated, so forces are not conservative in MD; set envelope='polynomial' and max_neighbors=None",
                stacklevel=3,
            )

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def replace(self, **changes) -> "ModelConfig":
        """A copy with ``changes``; ``est`` given as a mapping is merged into the current EST options."""
        check_renamed(changes)
        unknown = sorted(set(changes) - set(self.field_names()))
        if unknown:
            raise ValueError(f"unknown model config keys {unknown}; valid keys: {self.field_names()}")
        if isinstance(changes.get("est"), Mapping):
            changes["est"] = merge_est(self.est, changes["est"])
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["grid_resolution"] = list(d["grid_resolution"])
        return d
