r"""Edge-degree embedding (EquiformerV2): initial l>0 node features from geometry.

For each edge :math:`j \to i` a radial MLP of the invariant edge scalars
:math:`s_{ij}` (optionally concatenated with learned embeddings of the source
and target elements) gives the :math:`m = 0` coefficients of every degree in
the edge frame, :math:`h_{ij} \in \mathbb{R}^{(L+1) \times C}`. Rotating back
and averaging over the neighbours,

.. math::
    x_i = \frac{1}{\bar d} \sum_{j \in \mathcal N(i)} u(r_{ij})\,
          D_0(R_{ij})^{\top} (\sigma \odot h_{ij}),

where :math:`D_0` are the :math:`m = 0` rows of the edge Wigner-D (an
:math:`m = 0` coefficient in the edge frame is the axially symmetric function
:math:`\propto Y_l(\hat r_{ij})` in the global frame), :math:`u` the optional
smooth envelope, :math:`\sigma` EquiformerV2's rescale of degrees :math:`l > M`
and :math:`\bar d` = ``avg_degree``, the dataset's mean number of neighbours
(a constructor argument: compute it from the data).

Parameters: radial MLP ``[R + 2 E_c, E_c, E_c, (L+1) C]`` plus ``2 Z E_c`` for the
element embeddings (``use_atom_edge_embedding``).
"""
from __future__ import annotations

import torch
from torch import nn

from ..so3._layout import check_lmax
from .edges import EdgeFrame, check_frame, truncation_rescale
from .radial import RadialMLP

__all__ = ["EdgeDegreeEmbedding", "ElementEdgeScalars"]


class ElementEdgeScalars(nn.Module):
    r"""Edge scalars with element identity: ``[s_ij | e_src(Z_j) | e_tgt(Z_i)]``.

    ``forward(frame) -> [E, R + 2 E_c]`` (or ``frame.edge_scalars`` unchanged
    when ``num_elements`` is 0). Embedding tables ``[Z, E_c]`` start uniform in
    ``±init_scale`` (EquiformerV2: 1e-3) so the distance features dominate at
    initialisation. The element index is the atomic number, ``0 <= Z < num_elements``.
    """

    def __init__(self, *, num_elements: int, channels: int, init_scale: float = 1e-3) -> None:
        super().__init__()
        self.num_elements, self.channels = num_elements, channels
        if num_elements > 0:
            self.source = nn.Embedding(num_elements, channels)
            self.target = nn.Embedding(num_elements, channels)
            nn.init.uniform_(self.source.weight, -init_scale, init_scale)
            nn.init.uniform_(self.target.weight, -init_scale, init_scale)

    @property
    def extra_channels(self) -> int:
        return 2 * self.channels if self.num_elements > 0 else 0

    def forward(self, frame: EdgeFrame) -> torch.Tensor:
        if self.num_elements == 0:
            return frame.edge_scalars
        z = frame.atomic_numbers
        if z is None:
            raise ValueError(
                "element-aware edge scalars need atomic numbers: build the edge frame with "
                "atomic_numbers=..., or set use_atom_edge_embedding=False"
            )
        if z.numel() and (int(z.min()) < 0 or int(z.max()) >= self.num_elements):
            raise ValueError(
                f"atomic_numbers contain values outside 0..{self.num_elements - 1} "
                f"(min {int(z.min())}, max {int(z.max())}); raise num_elements"
            )
        src, tgt = frame.edge_index
        return torch.cat([frame.edge_scalars, self.source(z[src]), self.target(z[tgt])], dim=-1)  # [E, R + 2 E_c]


class EdgeDegreeEmbedding(nn.Module):
    """``forward(frame) -> [N, K, C]`` (see the module docstring).

    Args (keyword-only):
        lmax, mmax: degrees (the frame must be built with the same).
        channels: C, the node feature width.
        edge_scalar_channels: R, width of ``frame.edge_scalars`` (600 Gaussians in EquiformerV2).
        edge_channels: E_c, hidden width of the radial MLP (and of the element embeddings).
        num_elements: size of the element tables (index = atomic number; EquiformerV2: 90).
        use_atom_edge_embedding: concatenate source/target element embeddings to the edge scalars.
        avg_degree: mean number of incoming edges per atom in the training data (> 0).
        rescale_truncated: EquiformerV2's ``sqrt((2l+1)/(2M+1))`` on degrees ``l > M``.
    """

    def __init__(
        self,
        *,
        lmax: int,
        mmax: int,
        channels: int,
        edge_scalar_channels: int,
        edge_channels: int,
        num_elements: int = 90,
        use_atom_edge_embedding: bool = True,
        avg_degree: float,
        rescale_truncated: bool = True,
    ) -> None:
        super().__init__()
        check_lmax(lmax)
        if not 0 <= mmax <= lmax:
            raise ValueError(f"EdgeDegreeEmbedding: mmax must be in 0..lmax={lmax}, got {mmax}")
        if not avg_degree > 0:
            raise ValueError(
                f"EdgeDegreeEmbedding: avg_degree must be > 0 (mean neighbours per atom in the data), got {avg_degree}"
            )
        self.lmax, self.mmax, self.channels, self.avg_degree = lmax, mmax, channels, float(avg_degree)
        self.elements = ElementEdgeScalars(
            num_elements=num_elements if use_atom_edge_embedding else 0, channels=edge_channels
        )
        self.radial = RadialMLP(
            channels=[
                edge_scalar_channels + self.elements.extra_channels,
                edge_channels,
                edge_channels,
                (lmax + 1) * channels,
            ]
        )
        scale = truncation_rescale(lmax, mmax)[: lmax + 1] if rescale_truncated else torch.ones(lmax + 1)
        self.register_buffer("rescale", scale.to(torch.float64), persistent=False)  # [L+1] on the m=0 rows

    def extra_repr(self) -> str:
        return f"lmax={self.lmax}, mmax={self.mmax}, channels={self.channels}, avg_degree={self.avg_degree}"

    def forward(self, frame: EdgeFrame) -> torch.Tensor:
        check_frame(frame, self.lmax, self.mmax, type(self).__name__)
        s = self.elements(frame)  # [E, R']
        if s.shape[-1] != self.radial.in_channels:
            raise ValueError(
                f"{type(self).__name__}: edge scalars have {s.shape[-1]} features, expected "
                f"{self.radial.in_channels}; set edge_scalar_channels to the radial basis size"
            )
        E, L1 = s.shape[0], self.lmax + 1
        h = self.radial(s).view(E, L1, self.channels)  # [E, L+1, C] m=0 coefficients in the edge frame
        h = h * self.rescale.to(h.dtype)[:, None]
        if frame.envelope is not None:
            h = h * frame.envelope[:, None, None]
        D0 = frame.D_m[:, :L1, :]  # [E, L+1, K]: the m=0 rows come first in the m-major layout
        msg = torch.bmm(D0.transpose(1, 2), h)  # [E, K, C]
        return frame.scatter_targets(msg) / self.avg_degree  # [N, K, C]
