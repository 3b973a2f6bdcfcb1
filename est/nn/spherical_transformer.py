r"""The spherical Transformer: attention over the sphere points of each atom.

For each atom, with features :math:`h \in \mathbb{R}^{K\times C}` and points
:math:`p_1..p_S`:

1. scalar path :math:`h_0' = \mathrm{SiLU}(W_0\,\mathrm{LN}(h_0))`;
2. :math:`F = \mathcal{F}h \in \mathbb{R}^{S\times C}` (values at the points),
   per-point LayerNorm over channels;
3. :math:`Q, K, V = F W_{q,k,v} + b`, split into heads;
4. orientation encoding: ``"concat"`` appends :math:`p_s` to every head's
   queries and keys, so logits are :math:`(q_s\cdot k_t + p_s\cdot p_t)/\sqrt{d+3}`
   (the paper). :math:`p_s\cdot p_t` is the same for rotated grids, so we add
   the constant ``[S, S]`` bias :math:`P P^\top/\sqrt{d+3}` and scale
   :math:`q\cdot k` by :math:`1/\sqrt{d+3}` instead of concatenating (the same
   function, less work); ``"bias"`` adds a learned :math:`\sum_n a_{hn} P_n(p_s\cdot p_t)`
   (Legendre polynomials; rotation invariant); ``"none"`` adds nothing;
5. softmax attention over the S points (``scaled_dot_product_attention``),
   with :math:`\log w_t` added to the logits when the quadrature weights
   :math:`w_t` are not all equal, so that the attention sum is the quadrature
   of :math:`\int e^{q\cdot k(t)} v(t)\,dt / \int e^{q\cdot k(t)}\,dt` (without it a
   Gauss-Legendre or equiangular grid over-weights its poles and the module is
   not equivariant however fine the grid);
   ``logit_cap`` :math:`c` ("irreps" projections; off in this module, 4 in the
   ESTBlock default preset) bounds the
   content logits :math:`\ell(p, t) = Y(p)^\top A\, Y(t)` with
   :math:`A = A_q A_k^\top/\sqrt{d'}` (per atom and head): since
   :math:`\|Y(p)\| = 1` at every point, :math:`|\ell| \le \|A\|_2 \le \|A\|_F = \sigma`,
   and the module uses :math:`A\,c\tanh(\sigma/c)/\sigma`, so :math:`|\ell| < c`
   however sharp training makes the attention. :math:`\sigma` is rotation
   invariant (:math:`A \mapsto DAD^\top`, D orthogonal) and the logits stay a
   function of degree L in each point, so the cap costs no equivariance; it bounds
   what the grid must resolve, the spectrum of :math:`e^{\ell}`, whose degree-n
   part falls like :math:`I_n(c) \approx (c/2)^n/n!` (trained logits reached
   :math:`|\ell| \approx 6` on GFN2-xTB ethanol, where the degree-16 design
   aliased at 3e-3). A pointwise :math:`c\tanh(\ell/c)` would not do this: on
   sharp logits it tends to a step function on the sphere;
   ``value_skip`` (off by default) adds each point's own value to its attention
   output, :math:`o(p) = v(p) + \sum_t \mathrm{softmax}_t(\ell(p, \cdot))\,v(t)`: a
   softmax row is a convex average, so without it the output at p is a blurred
   copy of the values (how sharp, the bounded logits decide); with it the
   attention adds its spherical average to the pointwise value, and uniform
   attention (:math:`A = 0`, no orientation encoding) leaves EquiformerV2's
   pointwise S2 MLP plus the sphere mean of the values;
6. gated spherical experts :math:`\sum_e g_e\,\mathrm{MLP}_e` per point;
7. back to irreps :math:`\mathcal{F}^{-1}`, with the l = 0 row replaced by :math:`h_0'`.

``projections="irreps"`` (our default block) computes the same Transformer with
every linear map where it is cheapest. A channel-mixing linear commutes with
the transform, :math:`\mathcal{F}(hW) = (\mathcal{F}h)W`, and attention rows sum
to one, so :math:`\mathrm{attn}(V)W_1 = \mathrm{attn}(VW_1)`: with the two
per-point LayerNorms (before Q/K/V and at the start of each expert MLP) replaced
by one equivariant RMS norm of the irreps, the block is

.. math::
    \hat h = \mathrm{RMSNorm}(h),\quad
    [Q\,K\,V_1..V_E] = \mathcal{F}\big(W^{qkv}_l \hat h_l\big),\quad
    u = \sum_e g_e\, W^{o}_{e,l}\,\mathcal{F}^{-1}\mathrm{SiLU}\big(\mathrm{attn}(Q, K, V_e)\big)

with per-degree linears :math:`W_l` (:class:`~est.nn.linear.DegreeLinear`, bias
on l = 0, which reaches every point as a constant) acting on K = (L+1)^2
coefficients instead of S points, and the expert MLP's hidden width
``mlp_ratio * C`` carried by the values. The only per-point work left is the
attention itself and one SiLU.

With ``"irreps"`` projections the queries, keys and values are band-limited:
:math:`Q = YA_q`, :math:`K = YA_k`, :math:`V = YA_v` with the sampling matrix
:math:`Y \in \mathbb{R}^{S\times K}` and coefficient matrices :math:`A`. Per head
the attention is then evaluated through the K coefficients instead of the S
points,

.. math::
    QK^\top = Y\,(A_q A_k^\top)\,Y^\top,\qquad
    \mathrm{softmax}(\cdot)\,V = \big(\mathrm{softmax}(\cdot)\,Y\big)\,A_v,

the same function with :math:`S^2 K` multiply-adds per head for each product
instead of :math:`S^2 d` and :math:`S^2 d_v` (the attribute ``factored``
says which form a module uses: the cheaper one by this count). At the
default (one head, :math:`d = C`, :math:`d_v = 2C`, K = 16 at L = 3) the
:math:`S \times S` products cost :math:`2K / 3C` of the point form.

Everything acting per point commutes with a rotation of the points, so the
module is exactly as equivariant as the point set lets the transform pair be
(measured in ``benchmarks/bench_est_block.py``). In training, a random
rotation per graph can rotate the grid (``rotation`` argument: one Wigner-D
per atom, and rotated points for the encoding).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..so3 import split_scalar
from ..sphere.masters import Float64Masters
from .grid import GridConfig, check_features, check_float16_output, check_positive, is_float16, warn_float16
from .linear import DegreeLinear
from .norms import build_norm

__all__ = ["SphericalTransformer", "SphericalTransformerConfig", "ENCODINGS", "PROJECTIONS"]

ENCODINGS = ("concat", "bias", "none")
PROJECTIONS = ("points", "irreps")


@dataclass(kw_only=True)
class SphericalTransformerConfig:
    lmax: int
    channels: int
    num_heads: int = 1
    encoding: str = "concat"
    num_experts: int = 1
    mlp_ratio: int = 4
    bias_degree: int = 8  # Legendre degree of the "bias" encoding
    grid: GridConfig = field(default_factory=GridConfig)
    projections: str = "points"  # "points": the paper's per-point LayerNorm + linears; "irreps": see the module doc
    logit_cap: float | None = None  # bound c on |q . k| / sqrt(d') ("irreps" projections; step 5); None: off
    value_skip: bool = False  # o(p) = v(p) + attn(v)(p) (step 5)

    def __post_init__(self) -> None:
        check_positive(self, ("channels", "num_heads", "num_experts", "mlp_ratio"), owner="SphericalTransformerConfig")
        if self.logit_cap is not None:
            if not self.logit_cap > 0:
                raise ValueError(f"SphericalTransformerConfig: logit_cap must be > 0 or None, got {self.logit_cap!r}")
            if self.projections != "irreps":
                raise ValueError("SphericalTransformerConfig: logit_cap needs projections='irreps' (band-limited "
                                 f"queries and keys), got projections={self.projections!r}")


def _legendre_table(cosines: np.ndarray, degree: int) -> np.ndarray:
    """``P_n(cos)`` for ``n = 0..degree`` by Bonnet's recursion: ``[degree+1, ...]``."""
    P = [np.ones_like(cosines), cosines]
    for n in range(1, degree):
        P.append(((2 * n + 1) * cosines * P[n] - n * P[n - 1]) / (n + 1))
    return np.stack(P[: degree + 1])


class SphericalTransformer(Float64Masters):
    """``forward(x [N, K, C], gates [N, E] | None, rotation=None) -> [N, K, C]``.

    ``rotation``: ``(D [N, K, K], R [N, 3, 3])`` rotating each atom's grid.
    ``gates=None`` averages the experts.
    """

    def __init__(self, config: SphericalTransformerConfig | None = None, **kwargs) -> None:
        super().__init__()
        cfg = config if config is not None else SphericalTransformerConfig(**kwargs)
        if cfg.encoding not in ENCODINGS:
            raise ValueError(f"unknown orientation encoding {cfg.encoding!r}; expected one of {ENCODINGS}")
        if cfg.channels % cfg.num_heads:
            raise ValueError(f"channels={cfg.channels} must be divisible by num_heads={cfg.num_heads}")
        if cfg.projections not in PROJECTIONS:
            raise ValueError(f"unknown projections {cfg.projections!r}; expected one of {PROJECTIONS}")
        self.config = cfg
        C, L, E = cfg.channels, cfg.lmax, cfg.num_experts
        # "irreps": values at the points with the amplitude of the coefficients ("component" scaling, as
        # EquiformerV2's grids); without it the logits grow ~(L+1)^2 and the softmax aliases on the grid
        self.sft = cfg.grid.build(cfg.lmax, degree_scaling="component" if cfg.projections == "irreps" else "none")
        self.scalar = nn.Sequential(nn.LayerNorm(C), nn.Linear(C, C), nn.SiLU())
        if cfg.projections == "points":
            self.point_norm = nn.LayerNorm(C)
            self.q, self.k, self.v = nn.Linear(C, C), nn.Linear(C, C), nn.Linear(C, C)
            self.experts = nn.ModuleList(
                nn.Sequential(nn.LayerNorm(C), nn.Linear(C, cfg.mlp_ratio * C), nn.SiLU(), nn.Linear(cfg.mlp_ratio * C, C))
                for _ in range(E)
            )
        else:
            self.hidden = cfg.mlp_ratio * C  # per expert, carried by the values
            self.norm = build_norm("rms_norm_sh", lmax=L, channels=C)
            self.qkv = DegreeLinear(lmax=L, in_channels=C, out_channels=2 * C + E * self.hidden)
            self.out = DegreeLinear(lmax=L, in_channels=E * self.hidden, out_channels=C, bias=False)  # l = 0 row: h0'
        w = self.sft._masters["weights"]
        if not torch.allclose(w, w.mean().expand_as(w), rtol=1e-9, atol=0):
            self.register_master("log_weights", torch.log(w / w.mean()))  # [S]
        else:
            self.log_weights = None
        d = C // cfg.num_heads
        self.scale = 1.0 / np.sqrt(d + 3) if cfg.encoding == "concat" else 1.0 / np.sqrt(d)
        if cfg.encoding == "concat":  # p_s . p_t / sqrt(d + 3): what appending p to q and k adds to the logits
            pts = self.sft.points64
            self.register_master("orientation_bias", (pts @ pts.T) * self.scale)  # [S, S]
        if cfg.encoding == "bias":
            pts = self.sft.points64.numpy()
            table = _legendre_table(np.clip(pts @ pts.T, -1, 1), cfg.bias_degree)  # [D+1, S, S]
            self.register_master("legendre", torch.from_numpy(table))  # [D+1, S, S]
            self.bias_coeff = nn.Parameter(torch.zeros(cfg.num_heads, cfg.bias_degree + 1))  # [H, D+1]
        self.check_inputs = True
        #: evaluate the attention through the K coefficients (see the module doc): "irreps" projections only,
        #: where it needs fewer multiply-adds in the S x S products than the point form
        K, H = (L + 1) ** 2, cfg.num_heads
        width = 2 * C + E * cfg.mlp_ratio * C  # q, k and v channels over all heads
        self.factored = cfg.projections == "irreps" and 2 * H * K < width

    def _attention_bias(self, dtype) -> torch.Tensor | None:
        bias = None
        if self.config.encoding == "bias":
            bias = torch.einsum("hd,dst->hst", self.bias_coeff.to(dtype), self.legendre.to(dtype))  # [H, S, S]
        elif self.config.encoding == "concat":
            bias = self.orientation_bias.to(dtype)  # [S, S]
        if self.log_weights is not None:
            lw = self.log_weights.to(dtype)[None, None, :]  # [1, 1, S] over keys
            bias = lw if bias is None else bias + lw
        return bias

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                q_scale: torch.Tensor | None = None) -> torch.Tensor:
        """Multi-head softmax attention over the points: ``[N, S, *] x 3 -> [N, S, v's width]``;
        ``q_scale`` ``[N, H]`` multiplies each atom's and head's queries (the logit cap)."""
        H = self.config.num_heads
        q, k, v = (t.unflatten(-1, (H, -1)).transpose(1, 2) for t in (q, k, v))  # [N, H, S, d]
        if q_scale is not None:
            q = q * q_scale[..., None, None]  # [N, H, S, d]
        bias = self._attention_bias(q.dtype)  # [S, S], [H, S, S] or None
        # with autograd on, the math kernel: gradient forces differentiate the attention twice
        # (create_graph=True), which the fused CPU/GPU kernels do not support; no_grad inference may fuse
        with sdpa_kernel(SDPBackend.MATH) if torch.is_grad_enabled() else contextlib.nullcontext():
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=self.scale)  # [N, H, S, d_v]
        if self.config.value_skip:
            o = o + v  # [N, H, S, d_v]
        return o.transpose(1, 2).flatten(-2)  # [N, S, H * d_v]

    def _attend_factored(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The attention of :meth:`_attend` on band-limited inputs given by their coefficients:
        ``[N, K, *] x 3 -> [N, S, v's width]`` (``Y``: the sampling matrix, ``[S, K]``)."""
        H = self.config.num_heads
        Y = self.sft.to_matrix.to(q.dtype)  # [S, K]
        a = self._coefficient_logits(q, k)  # [N, H, K, K]
        if self.config.logit_cap is not None:
            a = a * self._cap_factor(a)[..., None, None]  # [N, H, K, K], |logits| < cap
        v = v.unflatten(-1, (H, -1)).transpose(1, 2)  # [N, H, K, d_v]
        # Y A Y^T with Y only ever the right operand (a 2-D right operand folds the batch into one GEMM)
        logits = (a.transpose(-1, -2) @ Y.T).transpose(-1, -2) @ Y.T  # [N, H, S, S]
        bias = self._attention_bias(logits.dtype)  # [S, S], [H, S, S] or None
        weights = torch.softmax(logits if bias is None else logits + bias, dim=-1)  # [N, H, S, S] over the keys
        mixed = weights @ Y  # [N, H, S, K]
        if self.config.value_skip:
            mixed = mixed + Y  # [N, H, S, K]: each point's own value
        o = mixed @ v  # [N, H, S, d_v]
        return o.transpose(1, 2).flatten(-2)  # [N, S, H * d_v]

    def _coefficient_logits(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """``A = A_q A_k^T / sqrt(d)`` per head from the query and key coefficients: ``[N, K, C] x 2 -> [N, H, K, K]``
        (the content logits are ``Y A Y^T``)."""
        H = self.config.num_heads
        q, k = (t.unflatten(-1, (H, -1)).transpose(1, 2) for t in (q, k))  # [N, H, K, d]
        return (q * self.scale) @ k.transpose(-1, -2)  # [N, H, K, K]

    def _logit_sigma(self, a: torch.Tensor) -> torch.Tensor:
        """``sigma = ||A||_F`` per atom and head (``a``: ``[N, H, K, K]``), the bound on the content logits that
        ``logit_cap`` acts on (module doc, step 5), smoothed at ``A = 0``."""
        return torch.sqrt(a.pow(2).sum((-1, -2)) + (1e-6 * self.config.logit_cap) ** 2)  # [N, H]

    def _cap_factor(self, a: torch.Tensor) -> torch.Tensor:
        """``c tanh(sigma/c) / sigma`` with ``sigma`` = :meth:`_logit_sigma` (``a``: ``[N, H, K, K]``): the factor on
        ``A`` (or on the queries) that keeps the content logits below ``logit_cap`` in magnitude (module doc, step 5)."""
        c = self.config.logit_cap
        sigma = self._logit_sigma(a)  # [N, H]
        return c * torch.tanh(sigma / c) / sigma  # [N, H], in (0, 1]

    def forward(
        self,
        x: torch.Tensor,
        gates: torch.Tensor | None = None,
        rotation: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        cfg = self.config
        if self.check_inputs:
            check_features(x, lmax=cfg.lmax, channels=cfg.channels, name="SphericalTransformer", module=self)
        fp16 = is_float16(x)
        if fp16:
            warn_float16("SphericalTransformer")
        N, E = x.shape[0], cfg.num_experts
        D = rotation[0] if rotation is not None else None  # [N, K, K]; the rotated points are not needed (the bias is invariant)
        h0 = self.scalar(x[:, 0])  # [N, C]
        if gates is None:
            gates = x.new_full((N, E), 1.0 / E)
        if cfg.projections == "points":
            f = self.point_norm(self.sft.to_sphere(x, rotation=D))  # [N, S, C]
            o = self._attend(self.q(f), self.k(f), self.v(f))  # [N, S, C]
            y = sum(gates[:, e, None, None] * expert(o) for e, expert in enumerate(self.experts))  # [N, S, C]
            out = self.sft.from_sphere(y, rotation=D)  # [N, K, C]
        else:
            C = cfg.channels
            c = self.qkv(self.norm(x))  # [N, K, 2C + E*M]
            sizes = [C, C, c.shape[-1] - 2 * C]
            if self.factored:  # the same attention through the coefficients (rotating them rotates the grid)
                c = c if D is None else D.transpose(-1, -2) @ c  # [N, K, 2C + E*M]
                o = self._attend_factored(*c.split(sizes, dim=-1))  # [N, S, E*M]
            else:
                g = None  # the cap's factor is rotation invariant: taken from the unrotated coefficients
                if cfg.logit_cap is not None:
                    g = self._cap_factor(self._coefficient_logits(*c.split(sizes, dim=-1)[:2]))  # [N, H]
                f = self.sft.to_sphere(c, rotation=D)  # [N, S, 2C + E*M]
                o = self._attend(*f.split(sizes, dim=-1), q_scale=g)  # [N, S, E*M] (split: one cat in backward)
            y = self.sft.from_sphere(F.silu(o), rotation=D)  # [N, K, E*M]
            y = (y.unflatten(-1, (E, self.hidden)) * gates[:, None, :, None]).flatten(-2)  # [N, K, E*M]
            out = self.out(y)  # [N, K, C]
        out = torch.cat([h0[:, None], split_scalar(out)[1]], dim=1)  # [N, K, C]
        if fp16 and self.check_inputs:
            check_float16_output(out, "SphericalTransformer")
        return out
