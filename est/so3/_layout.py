"""Index bookkeeping for irreps features.

Layout (the only one in est): ``x[..., k, c]`` with ``k = l*l + l + m`` for
``l = 0..L`` and ``m = -l..l`` (l-major). ``K = (L+1)^2``.

The SO(2) (eSCN) convolution works in an *m-major* layout truncated to
``|m| <= M``: first the ``m = 0`` coefficients for ``l = 0..L``, then for each
``m = 1..M`` the ``+m`` coefficients for ``l = m..L`` followed by the ``-m``
coefficients for ``l = m..L``.  Conversions are index gathers (``index_select``)
and scatters (``index_copy``), never a dense permutation matmul.
"""
from __future__ import annotations

import functools

import torch

__all__ = [
    "num_coefficients",
    "lmax_from_num_coefficients",
    "degree_index",
    "order_index",
    "m_major_index",
    "m_major_sizes",
    "to_m_major",
    "from_m_major",
    "check_lmax",
    "split_scalar",
]


def check_lmax(lmax: int) -> int:
    """Validate a maximum degree and return it as ``int``."""
    if isinstance(lmax, bool) or not isinstance(lmax, int) or lmax < 0:
        raise ValueError(f"lmax must be a non-negative integer, got {lmax!r}")
    return lmax


def num_coefficients(lmax: int) -> int:
    """``K = (lmax + 1)^2``: coefficients of degrees ``0..lmax``."""
    return (check_lmax(lmax) + 1) ** 2


def lmax_from_num_coefficients(num: int) -> int:
    """Inverse of :func:`num_coefficients`; ``ValueError`` if ``num`` is not a square."""
    lmax = int(round(num**0.5)) - 1
    if lmax < 0 or (lmax + 1) ** 2 != num:
        raise ValueError(f"{num} coefficients is not (L+1)^2 for any degree L")
    return lmax


def split_scalar(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [N, K, C] -> (x0 [N, 1, C], x_rest [N, K-1, C])``: the l = 0 row and the others.

    A split, not two slices: its backward is one ``cat``, where each slice's
    backward would zero-fill and copy a gradient the size of ``x``.
    """
    x0, rest = x.split([1, x.shape[1] - 1], dim=1)
    return x0, rest


@functools.lru_cache(maxsize=None)
def _lm(lmax: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    ls = tuple(l for l in range(lmax + 1) for _ in range(2 * l + 1))
    ms = tuple(m for l in range(lmax + 1) for m in range(-l, l + 1))
    return ls, ms


def degree_index(lmax: int, device=None) -> torch.Tensor:
    """``l`` of every coefficient, long ``[K]``."""
    return torch.tensor(_lm(check_lmax(lmax))[0], dtype=torch.long, device=device)


def order_index(lmax: int, device=None) -> torch.Tensor:
    """``m`` of every coefficient, long ``[K]``."""
    return torch.tensor(_lm(check_lmax(lmax))[1], dtype=torch.long, device=device)


@functools.lru_cache(maxsize=None)
def _m_major(lmax: int, mmax: int) -> tuple[int, ...]:
    idx = [l * l + l for l in range(lmax + 1)]
    for m in range(1, mmax + 1):
        idx += [l * l + l + m for l in range(m, lmax + 1)]
        idx += [l * l + l - m for l in range(m, lmax + 1)]
    return tuple(idx)


def m_major_index(lmax: int, mmax: int | None = None, device=None) -> torch.Tensor:
    """l-major positions listed in m-major order, truncated to ``|m| <= mmax``.

    ``to_m_major(x)[..., i, :] == x[..., m_major_index[i], :]``.
    """
    check_lmax(lmax)
    mmax = lmax if mmax is None else mmax
    if not 0 <= mmax <= lmax:
        raise ValueError(f"mmax must be in 0..lmax={lmax}, got {mmax}")
    return torch.tensor(_m_major(lmax, mmax), dtype=torch.long, device=device)


def m_major_sizes(lmax: int, mmax: int) -> list[int]:
    """Sizes of the m-major blocks: ``[L+1, 2(L), 2(L-1), ...]`` for ``m = 0..mmax``."""
    return [lmax + 1] + [2 * (lmax - m + 1) for m in range(1, mmax + 1)]


def to_m_major(x: torch.Tensor, index: torch.Tensor, dim: int = -2) -> torch.Tensor:
    """Gather ``[..., K, C] -> [..., K_M, C]`` with an index from :func:`m_major_index`."""
    return x.index_select(dim, index)


def from_m_major(x: torch.Tensor, index: torch.Tensor, lmax: int, dim: int = -2) -> torch.Tensor:
    """Scatter ``[..., K_M, C] -> [..., K, C]``; coefficients with ``|m| > M`` are zero."""
    dim = dim % x.dim()
    shape = list(x.shape)
    shape[dim] = num_coefficients(lmax)
    out = x.new_zeros(shape)
    return out.index_copy(dim, index, x)
