"""Equivariant layers on irreps features ``[N, (L+1)^2, C]``.

The EST update (:class:`ESTBlock`), its parts (:class:`SphericalTransformer`,
:class:`SteerableFFN`), the SO(2) graph attention and its edge frames, radial
bases, norms, per-degree linear, drop path and e3nn interop.
"""
from .attention import AttentionConfig, SO2GraphAttention
from .drop import EquivariantDropout, GraphDropPath
from .edges import EdgeFrame, build_edge_frame
from .est_block import PRESETS, ESTBlock, ESTBlockConfig, preset_config
from .ffn import SteerableFFN, SteerableFFNConfig
from .grid import GridConfig, check_features
from .irreps import from_e3nn, irreps_for, to_e3nn
from .linear import DegreeLinear
from .norms import NORM_KINDS, EquivariantLayerNorm, EquivariantRMSNorm, build_norm
from .radial import GaussianRadialBasis, PolynomialEnvelope, RadialMLP
from .so2 import SO2Convolution
from .spherical_transformer import ENCODINGS, SphericalTransformer, SphericalTransformerConfig

layer_norm_sh = EquivariantLayerNorm
rms_norm_sh = EquivariantRMSNorm

__all__ = [
    "SO2GraphAttention",
    "AttentionConfig",
    "SO2Convolution",
    "EdgeFrame",
    "build_edge_frame",
    "GaussianRadialBasis",
    "PolynomialEnvelope",
    "RadialMLP",
    "ESTBlock",
    "ESTBlockConfig",
    "PRESETS",
    "preset_config",
    "SphericalTransformer",
    "SphericalTransformerConfig",
    "ENCODINGS",
    "SteerableFFN",
    "SteerableFFNConfig",
    "GridConfig",
    "check_features",
    "DegreeLinear",
    "EquivariantLayerNorm",
    "EquivariantRMSNorm",
    "layer_norm_sh",
    "rms_norm_sh",
    "build_norm",
    "NORM_KINDS",
    "GraphDropPath",
    "EquivariantDropout",
    "irreps_for",
    "to_e3nn",
    "from_e3nn",
]
