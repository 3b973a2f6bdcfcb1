r"""Classifiers on explicit-edge graphs: est's layers and a tensor-product baseline.

Both map a PyG ``Batch`` (``pos``, ``atomic_numbers``, ``edge_index``,
``batch``) to logits ``[B, num_classes]`` and use the graph's own edges (no
cutoff graph), as the expressivity tasks require.

Readouts (sum over the nodes of each graph, then a map to logits):

* ``"invariant"``: the ``l = 0`` channels ``[B, C]`` -> Linear -> SiLU -> Linear;
* ``"equivariant"``: every coefficient ``[B, (L+1)^2 C]`` -> Linear, as in the
  rotational-symmetry experiment of Joshi et al. 2023 (deliberately not
  invariant: it reads the orientation of the pooled ``l > 0`` features).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ...models import ModelConfig
from ...models.backbone import EquiformerV2Backbone

__all__ = ["ClassifierConfig", "ESTClassifier", "TensorProductClassifier", "est_classifier",
           "tensor_product_classifier"]


def _readout(readout: str, in_scalars: int, in_all: int, num_classes: int) -> nn.Module:
    if readout == "invariant":
        return nn.Sequential(nn.Linear(in_scalars, in_scalars), nn.SiLU(), nn.Linear(in_scalars, num_classes))
    if readout == "equivariant":
        return nn.Linear(in_all, num_classes)
    raise ValueError(f"readout must be 'invariant' or 'equivariant', got {readout!r}")


def _pool(x: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    """Sum node rows ``[N, ...]`` per graph: ``[B, ...]``."""
    num_graphs = int(batch.max()) + 1 if batch.numel() else 0
    return x.new_zeros((num_graphs, *x.shape[1:])).index_add_(0, batch, x)


def _batch_vector(data) -> torch.Tensor:
    b = getattr(data, "batch", None)
    return torch.zeros(data.pos.shape[0], dtype=torch.long, device=data.pos.device) if b is None else b


@dataclass(kw_only=True)
class ClassifierConfig:
    """An EquiformerV2-style classifier: ``num_layers`` x (SO(2) attention + update).

    update: ``"ffn"`` (EquiformerV2), ``"est"`` (the EST block of ``preset``), ``"spherical"``
    (spherical experts only). preset: the EST block's preset (``"default"`` or
    ``"paper"``). Widths follow ``channels``; no dropout.
    """

    update: str = "est"
    preset: str = "default"
    lmax: int = 2
    mmax: int | None = None  # default min(2, lmax)
    num_layers: int = 1
    channels: int = 32
    readout: str = "invariant"
    num_classes: int = 2
    cutoff: float = 5.0
    num_radial: int = 32
    avg_degree: float = 2.0
    grid_resolution: tuple[int, int] = (18, 18)
    max_num_elements: int = 10
    est: dict | None = None  # further ``model.est`` options (est.models.ESTOptions fields) on top of ``preset``


class ESTClassifier(nn.Module):
    """est's backbone on the graph's own edges, pooled, then a readout."""

    def __init__(self, config: ClassifierConfig) -> None:
        super().__init__()
        c = self.config = config
        C = c.channels
        mcfg = ModelConfig(
            num_layers=c.num_layers, lmax=c.lmax, mmax=min(2, c.lmax) if c.mmax is None else c.mmax,
            channels=C, attn_hidden_channels=C, num_heads=2, attn_alpha_channels=max(8, C // 4),
            attn_value_channels=max(8, C // 4), ffn_hidden_channels=2 * C, edge_channels=C,
            num_radial=c.num_radial, grid_resolution=tuple(c.grid_resolution), norm="rms_norm_sh",
            cutoff=c.cutoff, max_neighbors=None, drop_path=0.0, alpha_drop=0.0, avg_degree=c.avg_degree,
            avg_num_nodes=10.0, max_num_elements=c.max_num_elements, update=c.update, est=dict(c.est or {}, preset=c.preset),
            regress_energy=False, regress_forces=None,
        )
        self.backbone = EquiformerV2Backbone(mcfg)
        K = (c.lmax + 1) ** 2
        self.head = _readout(c.readout, C, K * C, c.num_classes)

    def features(self, data) -> torch.Tensor:
        """Node features ``[N, (L+1)^2, C]`` after the last layer (the backbone's final norm)."""
        src, dst = data.edge_index
        edge_vec = data.pos.index_select(0, src) - data.pos.index_select(0, dst)  # [E, 3]
        return self.backbone.run_on_edges(data.atomic_numbers.long(), data.edge_index, edge_vec, _batch_vector(data))

    def forward(self, data) -> torch.Tensor:
        x = self.features(data)  # [N, K, C]
        pooled = _pool(x, _batch_vector(data))  # [B, K, C]
        if self.config.readout == "invariant":
            return self.head(pooled[:, 0])  # [B, classes]
        return self.head(pooled.flatten(1))  # [B, classes]


def est_classifier(*, update: str = "est", lmax: int = 2, readout: str = "invariant", **kwargs) -> ESTClassifier:
    """An :class:`ESTClassifier`; keyword arguments are :class:`ClassifierConfig` fields."""
    return ESTClassifier(ClassifierConfig(update=update, lmax=lmax, readout=readout, **kwargs))


class TensorProductClassifier(nn.Module):
    r"""A TFN/NequIP-style model from e3nn: per layer, for each edge
    :math:`m_{ij} = \mathrm{TP}_{w(|r_{ij}|)}(h_j, Y(\hat r_{ij}))` with a
    ``FullyConnectedTensorProduct`` whose weights come from a radial MLP, summed
    over neighbours (divided by ``avg_degree``), a gated nonlinearity and a
    linear self-connection. Features ``C x 0e + C x 1o + C x 2e + ...`` up to
    ``lmax`` (polar harmonics only, as NequIP by default), so its invariant
    readout is O(3)-invariant: it cannot tell mirror images apart by design.
    """

    def __init__(self, *, lmax: int = 2, channels: int = 32, num_layers: int = 1, readout: str = "invariant",
                 num_classes: int = 2, cutoff: float = 5.0, num_radial: int = 16, avg_degree: float = 2.0,
                 max_num_elements: int = 10) -> None:
        super().__init__()
        from e3nn import o3
        from e3nn.nn import FullyConnectedNet, Gate

        self.lmax, self.cutoff, self.num_radial, self.avg_degree = lmax, cutoff, num_radial, avg_degree
        self.readout_kind = readout
        C = channels
        self.irreps_sh = o3.Irreps.spherical_harmonics(lmax)
        self.embedding = nn.Embedding(max_num_elements, C)
        irreps_in = o3.Irreps(f"{C}x0e")
        self.layers = nn.ModuleList()
        for _ in range(num_layers):
            gated = o3.Irreps([(C, (l, (-1) ** l)) for l in range(1, lmax + 1)])
            gate = Gate(f"{C}x0e", [nn.functional.silu], f"{gated.num_irreps}x0e", [torch.sigmoid], gated)
            tp = o3.FullyConnectedTensorProduct(irreps_in, self.irreps_sh, gate.irreps_in, shared_weights=False)
            layer = nn.ModuleDict(dict(
                tp=tp,
                radial=FullyConnectedNet([num_radial, C, tp.weight_numel], nn.functional.silu),
                gate=gate,
                self_connection=o3.Linear(irreps_in, gate.irreps_out),
            ))
            self.layers.append(layer)
            irreps_in = gate.irreps_out
        self.irreps_out = irreps_in
        self.head = _readout(readout, C, irreps_in.dim, num_classes)

    def _radial(self, r: torch.Tensor) -> torch.Tensor:
        centres = torch.linspace(0.0, self.cutoff, self.num_radial, dtype=r.dtype, device=r.device)
        width = self.cutoff / self.num_radial
        return torch.exp(-0.5 * ((r[:, None] - centres) / width) ** 2)  # [E, R]

    def features(self, data) -> torch.Tensor:
        """Node features ``[N, irreps_out.dim]`` (e3nn layout)."""
        from e3nn import o3

        src, dst = data.edge_index
        vec = data.pos.index_select(0, src) - data.pos.index_select(0, dst)  # [E, 3]
        sh = o3.spherical_harmonics(self.irreps_sh, vec, normalize=True, normalization="component")  # [E, K]
        radial = self._radial(vec.norm(dim=-1))  # [E, R]
        h = self.embedding(data.atomic_numbers.long())  # [N, C]
        for layer in self.layers:
            msg = layer["tp"](h.index_select(0, src), sh, layer["radial"](radial))  # [E, dim]
            agg = msg.new_zeros(h.shape[0], msg.shape[1]).index_add_(0, dst, msg) / self.avg_degree  # [N, dim]
            h = layer["gate"](agg) + layer["self_connection"](h)  # [N, dim_out]
        return h

    def forward(self, data) -> torch.Tensor:
        h = self.features(data)  # [N, dim]
        pooled = _pool(h, _batch_vector(data))  # [B, dim]
        if self.readout_kind == "invariant":
            return self.head(pooled[:, : self.head[0].in_features])  # l = 0 block comes first
        return self.head(pooled)


def tensor_product_classifier(**kwargs) -> TensorProductClassifier:
    """A :class:`TensorProductClassifier` (keyword arguments as its constructor)."""
    return TensorProductClassifier(**kwargs)
