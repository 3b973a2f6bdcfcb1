r"""The EST update block: a dense mixture of steerable and spherical experts.

.. math::
    g = \mathrm{softmax}\big(W_2\,\mathrm{SiLU}(W_1\,\mathrm{SiLU}\dots\mathrm{LN}(x_0))\big) \in \mathbb{R}^{E},\qquad
    u = \sum_{i<E_{st}} g_i\,\mathrm{FFN}_i(x) + \mathrm{ST}(x, g_{E_{st}:}),\qquad
    x \leftarrow x + \mathrm{DropPath}(u)

with :math:`\mathrm{FFN}_i` EquiformerV2's feed-forward network
(:class:`~est.nn.ffn.SteerableFFN`, each with its own pre-norm) and ST the
:class:`~est.nn.spherical_transformer.SphericalTransformer` whose spherical
experts take the remaining gates. The gates read only l = 0 channels, so they
are invariant. Every expert always runs (no routing, no balancing loss). With
a single expert in total the router is skipped (g = 1).

In training, ``grid_rotation=True`` draws one uniformly random rotation per
graph (``batch``) and rotates the spherical Transformer's grid; in eval the
grid is fixed, so eval is deterministic.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..so3 import random_rotation, wigner_D
from ..sphere import default_num_points
from .drop import GraphDropPath
from .ffn import SteerableFFN, SteerableFFNConfig
from .grid import GridConfig, check_features, check_float16_output, check_positive, is_float16
from .spherical_transformer import SphericalTransformer, SphericalTransformerConfig

__all__ = ["ESTBlock", "ESTBlockConfig", "PRESETS", "preset_config", "default_degree", "DEFAULT_LOGIT_CAP"]


@dataclass(kw_only=True)
class ESTBlockConfig:
    """Every knob of the EST block (keyword-only; Hydra configs map 1:1)."""

    lmax: int
    channels: int
    num_steerable_experts: int = 1
    num_spherical_experts: int = 1
    ffn_hidden_channels: int = 128
    ffn_norm: str = "rms_norm_sh"
    ffn_grid: GridConfig = field(default_factory=lambda: GridConfig(kind="equiangular"))
    num_heads: int = 1
    encoding: str = "concat"
    mlp_ratio: int = 4
    projections: str = "points"  # spherical Transformer: "points" (the paper) or "irreps" (linears on coefficients)
    logit_cap: float | None = None  # spherical Transformer: bound on |attention logits| ("irreps"; None: off;
    #                                 the default preset: 4)
    value_skip: bool = False  # spherical Transformer: each point's value added to its attention output
    grid: GridConfig = field(default_factory=lambda: GridConfig(kind="design", normalization="quadrature"))
    grid_rotation: bool = True
    drop_path: float = 0.0
    router_hidden_channels: int | None = None  # default: channels

    def __post_init__(self) -> None:
        check_positive(self, ("channels", "ffn_hidden_channels", "num_heads", "mlp_ratio", "router_hidden_channels"), owner="ESTBlockConfig")
        if self.num_steerable_experts < 0 or self.num_spherical_experts < 0:
            raise ValueError("expert counts must be >= 0")
        if self.num_steerable_experts + self.num_spherical_experts == 0:
            raise ValueError("ESTBlock needs at least one expert (num_steerable_experts + num_spherical_experts >= 1)")


def _paper(lmax: int) -> dict:
    return dict(
        grid=GridConfig(kind="fibonacci", num_points=default_num_points(lmax), normalization="column"),
        num_heads=1,
        encoding="concat",
        projections="points",
        num_steerable_experts=1,
        num_spherical_experts=1,
        grid_rotation=True,
        ffn_hidden_channels=512,
    )


def default_degree(lmax: int) -> int:
    """Our default t-design degree for the spherical Transformer: ``t = max(16, min(4L, max(3L, 18)))``.

    t = 16 up to L = 4 (S = 146 points), 18 at L = 5, 6 (S = 182), 3L beyond.
    Chosen from two measurements. Trained models: after training on QM9 (L = 2,
    ``benchmarks/study_accuracy.py``, seed 0) the rotation error of the
    predicted properties was 4.5e-4 at t = 8 (S = 36), 4.7e-6 at t = 12 and
    4.1e-8 at t = 16 with identical accuracy (gap MAE 540 meV at all three;
    logits not yet bounded: with the bound, t = 16 gives 4e-13 .. 9e-10 over three seeds);
    fairchem's EquiformerV2 measured 7.6e-8 .. 1.4e-6 over three seeds. Trained
    logits are sharper than initial ones, so the softmax aliases on sparse
    grids. Block cost (``benchmarks/bench_est_block.py``, C = 128): the attention
    costs ~S^2 per atom, so t = 4L at L = 6 (S = 314) would cost ~3x the attention
    of t = 18 (S = 182), while with t = 18 the block costs 0.68x EquiformerV2's
    FFN block on its 18x18 grid and is ~900x more equivariant (6.5e-6 vs 5.9e-3).
    """
    return max(16, min(4 * lmax, max(3 * lmax, 18)))


#: the default preset's bound on |attention logits| (``ESTBlockConfig.logit_cap``)
DEFAULT_LOGIT_CAP = 4.0


def _default(lmax: int) -> dict:
    # our default: one spherical Transformer expert with its linear maps on the irreps coefficients
    # ("irreps" projections: no per-point LayerNorm, MLP width 2C carried by the values), on a
    # spherical design of degree default_degree(L). Chosen in benchmarks/bench_est_block.py: 0.41x
    # EquiformerV2's FFN block at L = 4, 0.68x at L = 6, and more equivariant than it at every L.
    # A steerable (FFN) expert can be added (num_steerable_experts=1); it then samples a design
    # never coarser than EquiformerV2's 18x18 grid: t = max(3L, 18).
    # The content logits are bounded by DEFAULT_LOGIT_CAP (est.nn.spherical_transformer, step 5):
    # trained attention sharpens, and unbounded logits alias on the design (ethanol, xTB: trained
    # rotation error 3.3e-3 -> 1.4e-4 with the cap, force MAE within the seed noise, 21.8 -> 22.2 meV/A
    # over three seeds; inert on QM9 and EMT).
    grid = GridConfig(kind="design", degree=default_degree(lmax), normalization="quadrature")
    ffn_grid = GridConfig(kind="design", degree=max(3 * lmax, 18), normalization="quadrature")
    return dict(grid=grid, ffn_grid=ffn_grid, num_steerable_experts=0, num_spherical_experts=1,
                projections="irreps", mlp_ratio=2, logit_cap=DEFAULT_LOGIT_CAP)


PRESETS = {"paper": _paper, "default": _default}


def preset_config(preset: str, *, lmax: int, channels: int, **overrides) -> ESTBlockConfig:
    """Config of a named preset (``"paper"``: the released EST module; ``"default"``: ours).

    The logit cap belongs to the irreps projections: overriding ``projections="points"``
    without a ``logit_cap`` drops the preset's cap (it needs band-limited logits).
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown ESTBlock preset {preset!r}; expected one of {sorted(PRESETS)}")
    values = PRESETS[preset](lmax)
    if overrides.get("projections", values.get("projections")) == "points" and "logit_cap" not in overrides:
        values.pop("logit_cap", None)
    values.update(overrides)
    return ESTBlockConfig(lmax=lmax, channels=channels, **values)


def check_batch(batch: torch.Tensor, num_nodes: int, name: str) -> None:
    """``ValueError`` unless ``batch`` is an integer ``[N]`` graph index with values in ``0..N-1``.

    Each graph has at least one atom, so there are at most N graphs; larger
    indices would make per-graph tensors (grid rotations, drop masks) that big.
    """
    if batch.dim() != 1 or batch.shape[0] != num_nodes:
        raise ValueError(
            f"{name}: batch must be a 1-D index with one entry per atom ({num_nodes}), got shape {tuple(batch.shape)}"
        )
    if batch.is_floating_point() or batch.dtype == torch.bool:
        raise ValueError(f"{name}: batch must be an integer (long) graph index, got {batch.dtype}; use batch.long()")
    if num_nodes == 0:
        return
    lo, hi = torch.stack(torch.aminmax(batch)).tolist()
    if lo < 0 or hi >= num_nodes:
        raise ValueError(
            f"{name}: batch holds graph indices in [{lo}, {hi}]; expected 0..N-1 = 0..{num_nodes - 1} "
            "(the graph of every atom, numbered from 0 as in a PyG Batch)"
        )


class ESTBlock(nn.Module):
    """Residual EST update ``forward(x [N, K, C], batch [N] | None) -> [N, K, C]``.

    Build it from a config or keywords; ``preset="paper"`` reproduces the
    released module, ``preset=None`` uses our default (see README):

    >>> block = ESTBlock(lmax=2, channels=8)
    >>> block(torch.randn(5, 9, 8)).shape
    torch.Size([5, 9, 8])
    """

    def __init__(self, config: ESTBlockConfig | None = None, *, preset: str | None = None, **kwargs) -> None:
        super().__init__()
        if config is None:
            if "lmax" not in kwargs or "channels" not in kwargs:
                raise TypeError("ESTBlock needs lmax= and channels= (or a config)")
            config = preset_config(preset or "default", **kwargs)
        elif kwargs or preset:
            raise TypeError("pass either a config or keywords/preset, not both")
        cfg = self.config = config
        E_st, E_sph = cfg.num_steerable_experts, cfg.num_spherical_experts
        self.num_experts = E_st + E_sph
        C = cfg.channels
        self.ffns = nn.ModuleList(
            SteerableFFN(
                SteerableFFNConfig(
                    lmax=cfg.lmax, channels=C, hidden_channels=cfg.ffn_hidden_channels, norm=cfg.ffn_norm, grid=cfg.ffn_grid
                )
            )
            for _ in range(E_st)
        )
        self.spherical = (
            SphericalTransformer(
                SphericalTransformerConfig(
                    lmax=cfg.lmax,
                    channels=C,
                    num_heads=cfg.num_heads,
                    encoding=cfg.encoding,
                    num_experts=E_sph,
                    mlp_ratio=cfg.mlp_ratio,
                    grid=cfg.grid,
                    projections=cfg.projections,
                    logit_cap=cfg.logit_cap,
                    value_skip=cfg.value_skip,
                )
            )
            if E_sph
            else None
        )
        if self.num_experts > 1:
            hidden = cfg.router_hidden_channels or C
            self.router = nn.Sequential(
                nn.LayerNorm(C), nn.Linear(C, hidden), nn.SiLU(), nn.Linear(hidden, self.num_experts), nn.SiLU()
            )
        else:
            self.router = None
        self.drop_path = GraphDropPath(cfg.drop_path)
        for m in self.modules():
            if hasattr(m, "check_inputs") and m is not self:
                m.check_inputs = False
        self.check_inputs = True

    def gates(self, x: torch.Tensor) -> torch.Tensor:
        """Invariant expert weights ``[N, E]`` from the l = 0 channels."""
        if self.router is None:
            return x.new_ones(x.shape[0], 1)
        return torch.softmax(self.router(x[:, 0]), dim=-1)

    @property
    def rotates_grid(self) -> bool:
        """Whether a forward call draws random grid rotations (training, ``grid_rotation``, a spherical expert)."""
        return self.training and self.config.grid_rotation and self.spherical is not None

    def _grid_rotation(self, x: torch.Tensor, batch: torch.Tensor | None, num_graphs: int | None):
        if not self.rotates_grid or x.shape[0] == 0:
            return None
        if num_graphs is None:  # one host sync; a backbone passes the count it already has
            num_graphs = 1 if batch is None else int(batch.max()) + 1
        R = random_rotation(num_graphs, dtype=x.dtype, device=x.device)  # [B, 3, 3]
        D = wigner_D(self.config.lmax, R, check=False)  # [B, K, K]
        if batch is None:
            return D.expand(x.shape[0], -1, -1), R.expand(x.shape[0], -1, -1)
        return D[batch], R[batch]  # [N, K, K], [N, 3, 3]

    def forward(self, x: torch.Tensor, batch: torch.Tensor | None = None, num_graphs: int | None = None) -> torch.Tensor:
        """``num_graphs``: ``batch.max() + 1`` if the caller knows it (saves a host sync per block in training)."""
        cfg = self.config
        if self.check_inputs:
            check_features(x, lmax=cfg.lmax, channels=cfg.channels, name="ESTBlock", module=self)
            if batch is not None:
                check_batch(batch, x.shape[0], "ESTBlock")
        g = self.gates(x)  # [N, E]
        E_st = cfg.num_steerable_experts
        update = None
        for i, ffn in enumerate(self.ffns):
            term = g[:, i, None, None] * ffn(x)  # [N, K, C]
            update = term if update is None else update + term
        if self.spherical is not None:
            term = self.spherical(x, g[:, E_st:], rotation=self._grid_rotation(x, batch, num_graphs))  # [N, K, C]
            update = term if update is None else update + term
        out = x + self.drop_path(update, batch)  # [N, K, C]
        if self.check_inputs and is_float16(x):
            check_float16_output(out, "ESTBlock")
        return out

    def extra_repr(self) -> str:
        c = self.config
        return (
            f"lmax={c.lmax}, channels={c.channels}, experts={c.num_steerable_experts}+{c.num_spherical_experts}, "
            f"grid={c.grid.kind}, heads={c.num_heads}, encoding={c.encoding!r}, projections={c.projections!r}"
        )
