"""Equivariant layers on irreps features ``[N, (L+1)^2, C]``.

The EST update (:class:`ESTBlock`), its parts (:class:`SphericalTransformer`,
:class:`SteerableFFN`), norms, per-degree linear, drop path and e3nn interop.
"""
from .drop import EquivariantDropout, GraphDropPath
from .est_block import PRESETS, ESTBlock, ESTBlockConfig, preset_config
from .ffn import SteerableFFN, SteerableFFNConfig
from .grid import GridConfig, check_features
from .irreps import from_e3nn, irreps_for, to_e3nn
from .linear import DegreeLinear
from .norms import NORM_KINDS, EquivariantLayerNorm, EquivariantRMSNorm, build_norm
from .spherical_transformer import ENCODINGS, SphericalTransformer, SphericalTransformerConfig

layer_norm_sh = EquivariantLayerNorm
rms_norm_sh = EquivariantRMSNorm

__all__ = [
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
