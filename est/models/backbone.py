r"""EquiformerV2-style backbone whose update block is replaceable by EST.

Forward (per batch of graphs):

1. radius graph (pure torch, periodic images when ``use_pbc``) and one
   deterministic edge frame per edge: ``D_m`` rotates global coefficients
   into the frame where the edge is the pole (kept with gradients);
2. atom embedding into the l = 0 channels plus the edge-degree embedding;
3. ``num_layers`` x [``x += DropPath(Attention(Norm(x)))``; ``x = Update(x)``]
   with Update an :class:`~est.nn.ESTBlock` (``update="ffn"`` is the block with
   one steerable expert: exactly EquiformerV2's ``x += DropPath(FFN(Norm(x)))``);
4. a final norm. Node features ``[N, (L+1)^2, C]`` go to the heads.
"""
from __future__ import annotations

import torch
from torch import nn

from ..geometry import radius_graph
from ..nn import ESTBlock, GridConfig, build_norm, preset_config
from ..nn.attention import AttentionConfig, SO2GraphAttention
from ..nn.drop import GraphDropPath
from ..nn.edge_embedding import EdgeDegreeEmbedding
from ..nn.edges import EdgeFrame, build_edge_frame
from ..nn.radial import GaussianRadialBasis
from ..so3 import num_coefficients
from .config import ModelConfig

__all__ = ["EquiformerV2Backbone", "attention_config", "update_block_config"]


def attention_config(cfg: ModelConfig, *, output_channels: int | None = None) -> AttentionConfig:
    return AttentionConfig(
        lmax=cfg.lmax,
        mmax=cfg.mmax,
        channels=cfg.channels,
        hidden_channels=cfg.attn_hidden_channels,
        num_heads=cfg.num_heads,
        alpha_channels=cfg.attn_alpha_channels,
        value_channels=cfg.attn_value_channels,
        output_channels=output_channels or cfg.channels,
        edge_scalar_channels=cfg.num_radial,
        edge_channels=cfg.edge_channels,
        num_elements=cfg.max_num_elements,
        use_atom_edge_embedding=cfg.use_atom_edge_embedding,
        alpha_drop=cfg.alpha_drop,
        use_gate_act=cfg.message_activation == "gate",
        grid_kind="equiangular",
        grid_resolution=cfg.grid_resolution,
    )


def _grid(base: GridConfig, options) -> GridConfig:
    """``base`` with the non-``None`` fields of a :class:`~est.models.config.GridOptions`; a new ``kind``
    drops the old kind's size fields unless given."""
    changes = {k: getattr(options, k) for k in ("kind", "num_points", "degree", "normalization")
               if getattr(options, k) is not None}
    if not changes:
        return base
    fields = dict(kind=base.kind, normalization=base.normalization)
    if changes.get("kind", base.kind) == base.kind:  # same kind: keep its size unless overridden
        fields.update(num_points=base.num_points, degree=base.degree, resolution=base.resolution,
                      relax_steps=base.relax_steps)
    fields.update(changes)
    return GridConfig(**fields)


def update_block_config(cfg: ModelConfig):
    """The :class:`~est.nn.ESTBlockConfig` of one update block (``cfg.update`` and ``cfg.est``)."""
    est = cfg.est
    overrides = dict(ffn_hidden_channels=cfg.ffn_hidden_channels, ffn_norm=cfg.norm, drop_path=cfg.drop_path)
    if cfg.update == "ffn" or est.preset == "paper":
        # EquiformerV2's FFN (and the released EST module) sample the e3nn grid
        overrides["ffn_grid"] = GridConfig(kind="equiangular", resolution=cfg.grid_resolution)
    for key in ("num_heads", "encoding", "grid_rotation", "mlp_ratio", "projections", "logit_cap", "value_skip",
                "num_steerable_experts", "num_spherical_experts"):
        if getattr(est, key) is not None:
            overrides[key] = getattr(est, key)
    if overrides.get("logit_cap") == 0:  # model.est.logit_cap=0: off
        overrides["logit_cap"] = None
    block = preset_config(est.preset, lmax=cfg.lmax, channels=cfg.channels, **overrides)
    block.grid = _grid(block.grid, est.grid)
    block.ffn_grid = _grid(block.ffn_grid, est.steerable_grid)
    if cfg.update == "ffn":
        block.num_steerable_experts, block.num_spherical_experts = 1, 0
    elif cfg.update == "spherical":
        block.num_steerable_experts = 0
        block.num_spherical_experts = max(1, block.num_spherical_experts)
    block.__post_init__()
    return block


class _AttentionResidual(nn.Module):
    """``x + DropPath(Attention(Norm(x)))``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.norm = build_norm(cfg.norm, lmax=cfg.lmax, channels=cfg.channels)
        self.attention = SO2GraphAttention(attention_config(cfg))
        self.drop_path = GraphDropPath(cfg.drop_path)

    def forward(self, x: torch.Tensor, frame: EdgeFrame, batch: torch.Tensor) -> torch.Tensor:
        return x + self.drop_path(self.attention(self.norm(x), frame), batch)


class EquiformerV2Backbone(nn.Module):
    """``forward(pos, atomic_numbers, batch, cell=None, pbc=None) -> (x [N, K, C], frame)``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        cfg = self.config = config
        self.radial = GaussianRadialBasis(
            num_basis=cfg.num_radial, cutoff=cfg.cutoff, width_factor=cfg.radial_width_factor, envelope=cfg.envelope
        )
        self.atom_embedding = nn.Embedding(cfg.max_num_elements, cfg.channels)
        self.edge_degree = EdgeDegreeEmbedding(
            lmax=cfg.lmax,
            mmax=cfg.mmax,
            channels=cfg.channels,
            edge_scalar_channels=cfg.num_radial,
            edge_channels=cfg.edge_channels,
            num_elements=cfg.max_num_elements,
            use_atom_edge_embedding=cfg.use_atom_edge_embedding,
            avg_degree=cfg.avg_degree,
        )
        block_cfg = update_block_config(cfg)
        self.attention_blocks = nn.ModuleList(_AttentionResidual(cfg) for _ in range(cfg.num_layers))
        self.update_blocks = nn.ModuleList(ESTBlock(block_cfg) for _ in range(cfg.num_layers))
        for block in self.update_blocks:
            block.check_inputs = False
        self.final_norm = build_norm(cfg.norm, lmax=cfg.lmax, channels=cfg.channels)

    def check_atomic_numbers(self, z: torch.Tensor) -> None:
        bad = (z < 1) | (z >= self.config.max_num_elements)
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            raise ValueError(
                f"atomic_numbers contains {int(z[i])} at index {i}; expected 1..{self.config.max_num_elements - 1} "
                "(raise max_num_elements for heavier elements)"
            )

    def build_frame(self, pos, atomic_numbers, batch, cell=None, pbc=None) -> EdgeFrame:
        cfg = self.config
        periodic = cfg.use_pbc and cell is not None and pbc is not None and bool(pbc.any())
        graph = radius_graph(
            pos,
            cfg.cutoff,
            batch=batch,
            cell=cell if periodic else None,
            pbc=pbc if periodic else None,
            max_neighbors=cfg.max_neighbors,
            tie_mode=cfg.neighbor_tie_mode,
        )
        return build_edge_frame(
            graph.edge_index,
            graph.edge_vec,
            lmax=cfg.lmax,
            mmax=cfg.mmax,
            num_nodes=pos.shape[0],
            radial_basis=self.radial,
            atomic_numbers=atomic_numbers,
            roll=self._random_roll(graph.edge_index.shape[1], pos),
        )

    def _random_roll(self, num_edges: int, like: torch.Tensor) -> torch.Tensor | None:
        """Uniform angles ``[E]`` in training when ``edge_roll`` is on, else ``None``."""
        if not (self.training and self.config.edge_roll):
            return None
        return torch.rand(num_edges, dtype=like.dtype, device=like.device) * (2 * torch.pi)  # [E]

    def forward(self, pos, atomic_numbers, batch, cell=None, pbc=None):
        self.check_atomic_numbers(atomic_numbers)
        frame = self.build_frame(pos, atomic_numbers, batch, cell, pbc)
        return self.layers(frame, atomic_numbers, batch), frame

    def run_on_edges(self, atomic_numbers, edge_index, edge_vec, batch) -> torch.Tensor:
        """Node features ``[N, K, C]`` on given edges (``edge_vec = pos[src] - pos[dst]``, ``[E, 3]``)
        instead of the radius graph: graphs whose edges are part of the input."""
        cfg = self.config
        self.check_atomic_numbers(atomic_numbers)
        frame = build_edge_frame(
            edge_index, edge_vec, lmax=cfg.lmax, mmax=cfg.mmax, num_nodes=atomic_numbers.shape[0],
            radial_basis=self.radial, atomic_numbers=atomic_numbers,
        )
        return self.layers(frame, atomic_numbers, batch)

    def layers(self, frame: EdgeFrame, atomic_numbers, batch) -> torch.Tensor:
        """Embeddings and the ``num_layers`` blocks on a built frame: ``[N, K, C]`` after the final norm."""
        cfg = self.config
        emb = self.atom_embedding(atomic_numbers)  # [N, C]
        higher = emb.new_zeros(emb.shape[0], num_coefficients(cfg.lmax) - 1, cfg.channels)  # [N, K-1, C]
        x = torch.cat([emb[:, None], higher], dim=1)  # [N, K, C]
        x = x + self.edge_degree(frame)  # [N, K, C]
        # one host sync per forward (not per block) for the per-graph grid rotations in training
        num_graphs = int(batch.max()) + 1 if any(u.rotates_grid for u in self.update_blocks) and batch.numel() else None
        for attention, update in zip(self.attention_blocks, self.update_blocks):
            x = attention(x, frame, batch)
            x = update(x, batch, num_graphs=num_graphs)
        return self.final_norm(x)
