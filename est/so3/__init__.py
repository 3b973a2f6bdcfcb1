"""SO(3) machinery: real spherical harmonics, Wigner-D matrices, layouts.

Layout: l-major coefficients ``k = l*l + l + m``, e3nn's real convention
(pole on ``y``), component normalisation. See :mod:`est.so3._harmonics`.
"""
from ._harmonics import spherical_harmonics
from ._layout import (
    check_lmax,
    degree_index,
    from_m_major,
    lmax_from_num_coefficients,
    m_major_index,
    m_major_sizes,
    num_coefficients,
    order_index,
    split_scalar,
    to_m_major,
)
from ._wigner import (
    angles_to_matrix,
    block_slices,
    check_rotations,
    matrix_to_angles,
    random_rotation,
    rotation_x,
    rotation_y,
    wigner_D,
    wigner_D_from_angles,
)

__all__ = [
    "spherical_harmonics",
    "wigner_D",
    "split_scalar",
    "wigner_D_from_angles",
    "matrix_to_angles",
    "angles_to_matrix",
    "random_rotation",
    "rotation_x",
    "rotation_y",
    "block_slices",
    "check_rotations",
    "check_lmax",
    "num_coefficients",
    "lmax_from_num_coefficients",
    "degree_index",
    "order_index",
    "m_major_index",
    "m_major_sizes",
    "to_m_major",
    "from_m_major",
]
