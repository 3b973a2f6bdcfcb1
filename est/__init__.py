"""est: the Equivariant Spherical Transformer for molecular modelling.

Irreps features everywhere use one layout, ``[N, (L+1)^2, C]``: N atoms (or
nodes), K = (L+1)^2 real spherical-harmonic coefficients in l-major order
(index ``l*l + l + m``, m = -l..l, e3nn's real convention with the pole on the
y axis), C channels.
"""
__version__ = "0.1.0"

from .nn import ESTBlock, ESTBlockConfig, SphericalTransformer, SteerableFFN  # noqa: E402

__all__ = ["ESTBlock", "ESTBlockConfig", "SphericalTransformer", "SteerableFFN", "__version__"]
