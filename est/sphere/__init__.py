"""Sampling the sphere: point sets, weights, and the spherical Fourier transform.

``sphere_points`` answers "which points and weights"; ``SphericalFourierTransform``
is "the transform". See :mod:`est.sphere.points` for what each kind makes exact.
"""
from .points import (
    KINDS,
    default_num_points,
    design_points,
    equiangular_points,
    fibonacci_points,
    gauss_legendre_points,
    relax_points,
    sphere_points,
)
from .transform import DEGREE_SCALINGS, NORMALIZATIONS, SphericalFourierTransform, degree_scale, transform_matrices

__all__ = [
    "KINDS",
    "NORMALIZATIONS",
    "sphere_points",
    "fibonacci_points",
    "gauss_legendre_points",
    "equiangular_points",
    "design_points",
    "relax_points",
    "default_num_points",
    "SphericalFourierTransform",
    "transform_matrices",
    "degree_scale",
    "DEGREE_SCALINGS",
]
