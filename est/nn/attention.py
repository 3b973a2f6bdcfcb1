r"""SO(2)-equivariant graph attention (EquiformerV2's ``SO2EquivariantGraphAttention``).

For an edge :math:`j \to i` with edge-frame rotation :math:`D_{ij}` (rows
:math:`|m| \le M`, :class:`~est.nn.edges.EdgeFrame`):

.. math::
    \begin{aligned}
    m_{ij} &= D_{ij}\,[x_j \,\|\, x_i] && [E, K_M, 2C]\\
    (h_{ij}, a_{ij}, g_{ij}) &= \mathrm{SO2Conv}_1(m_{ij};\ w_1(s_{ij})) && h: [E, K_M, H]\\
    h_{ij} &\leftarrow \mathrm{Act}(g_{ij}, h_{ij}) && \text{separable S2 / gate / S2}\\
    v_{ij} &= \mathrm{SO2Conv}_2(h_{ij}) && [E, K_M, n_h d_v]\\
    \ell_{ij}^{(k)} &= \langle \phi(\mathrm{LN}(a_{ij}^{(k)})),\ \theta^{(k)} \rangle && \text{per head } k\\
    \alpha_{ij}^{(k)} &= \frac{u_{ij} \exp \ell_{ij}^{(k)}}{\sum_{j'} u_{ij'} \exp \ell_{ij'}^{(k)}}
        && \text{softmax over the edges into } i\\
    y_i &= W \sum_j u_{ij}\, D_{ij}^{\top} \big(\sigma \odot \alpha_{ij} v_{ij}\big) && [N, K, O]
    \end{aligned}

with :math:`s_{ij}` the edge scalars (optionally with source/target element
embeddings), :math:`\phi` = SmoothLeakyReLU(0.2), :math:`u` the smooth
envelope of the frame (1 without one), :math:`\sigma` EquiformerV2's rescale of
degrees :math:`l > M` and :math:`W` a per-degree linear map. The envelope in
both the softmax and the message makes the output a smooth function of the
positions when edges cross the cutoff (a lone edge has :math:`\alpha = 1`, its
message still fades with :math:`u`). With ``use_s2_act_attn`` the logits are
instead :math:`n_h` extra invariant outputs of :math:`\mathrm{SO2Conv}_2`
(after the activation; Equiformer v1 style).

Parameter count (``n_m = L-m+1``, :math:`P = \sum_{m=1}^{M} n_m^2`,
:math:`Q = \sum_{m=0}^{M} n_m`, :math:`R' = R + 2E_c` with element embeddings):

* element tables: :math:`2 Z E_c` (if ``use_atom_edge_embedding``);
* ``so2_conv_1``: :math:`(L+1)2C\,((L+1)H + X_1) + (L+1)H + X_1 + 2P\cdot 2C H`,
  :math:`X_1 = n_h d_a + G`, :math:`G = H` (separable S2), :math:`L H` (gate) or 0;
  with ``use_s2_act_attn`` :math:`X_1 = G`;
* its radial MLP ``[R', E_c, E_c, 2C Q]``: :math:`(R'+1)E_c + 2E_c + (E_c+1)E_c + 2E_c + (E_c+1)2CQ`;
* ``so2_conv_2``: :math:`(L+1)H((L+1)n_h d_v + X_2) + (L+1)n_h d_v + X_2 + 2P H n_h d_v`,
  :math:`X_2 = n_h` with ``use_s2_act_attn`` else 0;
* logits: :math:`2 d_a` (LayerNorm, ``use_attn_renorm``) + :math:`n_h d_a` (unless ``use_s2_act_attn``);
* output :class:`~est.nn.linear.DegreeLinear`: :math:`(L+1) n_h d_v O + O`.

:func:`attention_num_parameters` evaluates it; the tests check it against the module.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..so3 import num_coefficients
from ..so3._layout import check_lmax
from .activations import GateActivation, S2GridActivation, SeparableS2Activation, SmoothLeakyReLU
from .edge_embedding import ElementEdgeScalars
from .edges import EdgeFrame, check_frame, truncation_rescale
from .grid import check_dtype
from .linear import DegreeLinear
from .so2 import SO2Convolution

__all__ = ["AttentionConfig", "SO2GraphAttention", "attention_num_parameters", "segment_softmax"]

ATTN_ACTIVATIONS = ("smooth_leaky_relu", "silu")


@dataclass(kw_only=True)
class AttentionConfig:
    """Shape and options of :class:`SO2GraphAttention` (EquiformerV2 OC20 values in brackets).

    lmax, mmax: degrees L, M [6, 2]. channels: C, node feature width [128].
    hidden_channels: H, width after the first SO(2) convolution [64].
    num_heads: n_h [8]. alpha_channels: d_a per head [64]. value_channels: d_v per head [16].
    output_channels: O [= channels]. edge_scalar_channels: R, width of the frame's
    edge scalars [600]. edge_channels: E_c, hidden width of the radial MLP [128].
    num_elements: Z, element table size [90]; use_atom_edge_embedding [True].
    attn_activation: logits nonlinearity, ``"smooth_leaky_relu"`` [ ] or ``"silu"``.
    use_s2_act_attn: logits from the second convolution, after the activation [False].
    use_attn_renorm: LayerNorm on alpha features [True].
    use_gate_act: gate activation instead of the S2 grid [False].
    use_sep_s2_act: separable S2 activation (l=0 from gate scalars) [True].
    alpha_drop: dropout on attention weights [0.1].
    grid_kind, grid_resolution, grid_num_points, grid_normalization: the S2 grid
    [equiangular, (18, 18), None, "component"].
    rescale_truncated: sqrt((2l+1)/(2M+1)) on degrees l > M on the way back and on the grid [True].
    """

    lmax: int
    mmax: int
    channels: int
    hidden_channels: int
    num_heads: int
    alpha_channels: int
    value_channels: int
    output_channels: int
    edge_scalar_channels: int
    edge_channels: int
    num_elements: int = 90
    use_atom_edge_embedding: bool = True
    attn_activation: str = "smooth_leaky_relu"
    use_s2_act_attn: bool = False
    use_attn_renorm: bool = True
    use_gate_act: bool = False
    use_sep_s2_act: bool = True
    alpha_drop: float = 0.0
    grid_kind: str = "equiangular"
    grid_resolution: tuple[int, int] | None = (18, 18)
    grid_num_points: int | None = None
    grid_normalization: str = "component"
    rescale_truncated: bool = True

    def __post_init__(self) -> None:
        check_lmax(self.lmax)
        if not 0 <= self.mmax <= self.lmax:
            raise ValueError(f"AttentionConfig: mmax must be in 0..lmax={self.lmax}, got {self.mmax}")
        for f in ("channels", "hidden_channels", "num_heads", "alpha_channels", "value_channels",
                  "output_channels", "edge_scalar_channels", "edge_channels"):
            if getattr(self, f) < 1:
                raise ValueError(f"AttentionConfig: {f} must be >= 1, got {getattr(self, f)}")
        if self.attn_activation not in ATTN_ACTIVATIONS:
            raise ValueError(
                f"AttentionConfig: unknown attn_activation {self.attn_activation!r}; expected {ATTN_ACTIVATIONS}"
            )
        if self.use_gate_act and self.lmax < 1:
            raise ValueError("AttentionConfig: use_gate_act needs lmax >= 1")
        if not 0.0 <= self.alpha_drop < 1.0:
            raise ValueError(f"AttentionConfig: alpha_drop must be in [0, 1), got {self.alpha_drop}")

    @property
    def gate_channels(self) -> int:
        """G: invariant gate outputs of the first convolution."""
        if self.use_gate_act:
            return self.lmax * self.hidden_channels
        return self.hidden_channels if self.use_sep_s2_act else 0


def segment_softmax(
    logits: torch.Tensor, index: torch.Tensor, num_segments: int, weight: torch.Tensor | None = None
) -> torch.Tensor:
    r"""Softmax of ``logits [E, H]`` over the edges sharing ``index [E]``.

    With ``weight`` :math:`u \ge 0` ``[E]``:
    :math:`\alpha_e = u_e e^{\ell_e} / \sum_{e' : i(e') = i(e)} u_{e'} e^{\ell_{e'}}`
    (the per-segment maximum is subtracted first; it cancels exactly).
    Segments whose weights are all 0 give 0.
    """
    H = logits.shape[1]
    seg_max = logits.new_full((num_segments, H), -torch.inf)
    seg_max = seg_max.scatter_reduce(0, index[:, None].expand(-1, H), logits.detach(), "amax", include_self=True)
    e = torch.exp(logits - seg_max[index])  # [E, H]
    if weight is not None:
        e = e * weight[:, None]
    den = logits.new_zeros((num_segments, H)).index_add_(0, index, e)  # [N, H]
    return e / den[index].clamp_min(torch.finfo(e.dtype).tiny)  # [E, H]


class SO2GraphAttention(nn.Module):
    """``forward(x [N, K, C], frame: EdgeFrame) -> [N, K, O]`` (module docstring).

    Built from an :class:`AttentionConfig` (``SO2GraphAttention(config)``) or
    from its fields as keywords (``SO2GraphAttention(lmax=6, mmax=2, ...)``).
    """

    def __init__(self, config: AttentionConfig | None = None, **kwargs) -> None:
        super().__init__()
        if config is None:
            config = AttentionConfig(**kwargs)
        elif kwargs:
            raise TypeError("SO2GraphAttention: pass either a config or keyword fields, not both")
        self.config = c = config
        self.lmax, self.mmax = c.lmax, c.mmax
        self.elements = ElementEdgeScalars(
            num_elements=c.num_elements if c.use_atom_edge_embedding else 0, channels=c.edge_channels
        )
        radial_in = c.edge_scalar_channels + self.elements.extra_channels
        alpha_out = 0 if c.use_s2_act_attn else c.num_heads * c.alpha_channels
        self.so2_conv_1 = SO2Convolution(
            lmax=c.lmax,
            mmax=c.mmax,
            in_channels=2 * c.channels,
            out_channels=c.hidden_channels,
            radial_channels=[radial_in, c.edge_channels, c.edge_channels],
            extra_m0_channels=alpha_out + c.gate_channels,
        )
        grid = dict(
            lmax=c.lmax,
            mmax=c.mmax,
            grid_kind=c.grid_kind,
            grid_resolution=c.grid_resolution,
            grid_num_points=c.grid_num_points,
            grid_normalization=c.grid_normalization,
            truncation_rescale=c.rescale_truncated,
        )
        if c.use_gate_act:
            self.act = GateActivation(lmax=c.lmax, mmax=c.mmax, channels=c.hidden_channels)
        elif c.use_sep_s2_act:
            self.act = SeparableS2Activation(**grid)
        else:
            self.act = S2GridActivation(**grid)
        value_out = c.num_heads * c.value_channels
        self.so2_conv_2 = SO2Convolution(
            lmax=c.lmax,
            mmax=c.mmax,
            in_channels=c.hidden_channels,
            out_channels=value_out,
            radial_channels=None,
            extra_m0_channels=c.num_heads if c.use_s2_act_attn else 0,
        )
        if c.use_s2_act_attn:
            self.alpha_norm, self.alpha_act, self.alpha_dot = None, None, None
        else:
            self.alpha_norm = nn.LayerNorm(c.alpha_channels) if c.use_attn_renorm else nn.Identity()
            self.alpha_act = SmoothLeakyReLU(0.2) if c.attn_activation == "smooth_leaky_relu" else nn.SiLU()
            bound = 1 / math.sqrt(c.alpha_channels)
            self.alpha_dot = nn.Parameter(torch.empty(c.num_heads, c.alpha_channels).uniform_(-bound, bound))
        self.alpha_dropout = nn.Dropout(c.alpha_drop) if c.alpha_drop > 0 else nn.Identity()
        self.proj = DegreeLinear(lmax=c.lmax, in_channels=value_out, out_channels=c.output_channels)
        rescale = truncation_rescale(c.lmax, c.mmax)
        if not c.rescale_truncated:
            rescale = torch.ones_like(rescale)
        self.register_buffer("rescale", rescale, persistent=False)  # [K_M] float64

    def extra_repr(self) -> str:
        c = self.config
        return (
            f"lmax={c.lmax}, mmax={c.mmax}, channels={c.channels}, heads={c.num_heads}, "
            f"alpha={c.alpha_channels}, value={c.value_channels}, output={c.output_channels}"
        )

    def forward(self, x: torch.Tensor, frame: EdgeFrame) -> torch.Tensor:
        c, name = self.config, type(self).__name__
        K = num_coefficients(c.lmax)
        if x.dim() != 3 or x.shape[1] != K or x.shape[2] != c.channels:
            raise ValueError(
                f"{name}: expected node features [N, K={K}, C={c.channels}] (lmax={c.lmax}), got {tuple(x.shape)}"
            )
        check_frame(frame, c.lmax, c.mmax, name)
        check_dtype(x, self, name)
        if x.shape[0] != frame.num_nodes:
            raise ValueError(f"{name}: x has {x.shape[0]} nodes but the edge frame has {frame.num_nodes}")
        E, target = frame.num_edges, frame.edge_index[1]
        s = self.elements(frame)  # [E, R']

        x_src, x_tgt = frame.gather_edges(x)  # [E, K, C] each
        m = frame.to_edge(torch.cat([x_src, x_tgt], dim=-1))  # [E, K_M, 2C]
        h, extra = self.so2_conv_1(m, s)  # [E, K_M, H], [E, X_1]
        n_alpha = 0 if c.use_s2_act_attn else c.num_heads * c.alpha_channels
        if c.use_gate_act or c.use_sep_s2_act:
            h = self.act(extra[:, n_alpha:], h)  # [E, K_M, H]
        else:
            h = self.act(h)
        v, logits = self.so2_conv_2(h)  # [E, K_M, n_h d_v], [E, n_h] | None
        if not c.use_s2_act_attn:
            a = extra[:, :n_alpha].view(E, c.num_heads, c.alpha_channels)  # [E, n_h, d_a]
            a = self.alpha_act(self.alpha_norm(a))
            logits = (a * self.alpha_dot).sum(-1)  # [E, n_h]
        alpha = segment_softmax(logits, target, frame.num_nodes, frame.envelope)  # [E, n_h]
        alpha = self.alpha_dropout(alpha)
        if frame.envelope is not None:
            alpha = alpha * frame.envelope[:, None]
        v = v.view(E, v.shape[1], c.num_heads, c.value_channels) * alpha[:, None, :, None]  # [E, K_M, n_h, d_v]
        msg = frame.to_global(v.flatten(2), self.rescale)  # [E, K, n_h d_v]
        return self.proj(frame.scatter_targets(msg))  # [N, K, O]


def attention_num_parameters(config: AttentionConfig) -> int:
    """Closed-form parameter count of ``SO2GraphAttention(config)`` (module docstring)."""
    c = config
    L, M, C, H = c.lmax, c.mmax, c.channels, c.hidden_channels
    Ec, V = c.edge_channels, c.num_heads * c.value_channels
    n = [L - m + 1 for m in range(M + 1)]
    P, Q = sum(k * k for k in n[1:]), sum(n)
    elem = 2 * c.num_elements * Ec if c.use_atom_edge_embedding else 0
    R = c.edge_scalar_channels + (2 * Ec if c.use_atom_edge_embedding else 0)
    X1 = (0 if c.use_s2_act_attn else c.num_heads * c.alpha_channels) + c.gate_channels
    X2 = c.num_heads if c.use_s2_act_attn else 0
    conv1 = (L + 1) * 2 * C * ((L + 1) * H + X1) + (L + 1) * H + X1 + 2 * P * 2 * C * H
    radial = (R + 1) * Ec + 2 * Ec + (Ec + 1) * Ec + 2 * Ec + (Ec + 1) * 2 * C * Q
    conv2 = (L + 1) * H * ((L + 1) * V + X2) + (L + 1) * V + X2 + 2 * P * H * V
    logits = 0
    if not c.use_s2_act_attn:
        logits = (2 * c.alpha_channels if c.use_attn_renorm else 0) + c.num_heads * c.alpha_channels
    proj = (L + 1) * V * c.output_channels + c.output_channels
    return elem + conv1 + radial + conv2 + logits + proj
