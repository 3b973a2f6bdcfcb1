"""Pure-torch stand-in for the ``torch_scatter`` functions fairchem 1.10 calls.

fairchem-core imports ``torch_scatter`` at module level (``scatter``,
``segment_coo``, ``segment_csr``); the compiled package is source-only on PyPI.
Importing this module registers itself as ``sys.modules["torch_scatter"]``
before fairchem is imported. Reductions go through ``index_add_`` /
``scatter_reduce_`` (what torch_scatter computes, without the extension).
"""
from __future__ import annotations

import sys

import torch


def _broadcast(index: torch.Tensor, src: torch.Tensor, dim: int) -> torch.Tensor:
    dim = dim % src.dim()
    if index.dim() == 1:
        shape = [1] * src.dim()
        shape[dim] = -1
        index = index.view(shape)
    return index.expand_as(src)


def scatter(src: torch.Tensor, index: torch.Tensor, dim: int = -1, out: torch.Tensor | None = None,
            dim_size: int | None = None, reduce: str = "sum") -> torch.Tensor:
    """out[..., index[i], ...] (+)= src[..., i, ...] along ``dim``; reduce in sum/add/mean/max/min/mul."""
    dim = dim % src.dim()
    if dim_size is None:
        dim_size = int(index.max()) + 1 if index.numel() else 0
    shape = list(src.shape)
    shape[dim] = dim_size
    if reduce in ("sum", "add") and index.dim() == 1:
        res = src.new_zeros(shape).index_add_(dim, index, src)
    else:
        idx = _broadcast(index, src, dim)
        red = {"sum": "sum", "add": "sum", "mean": "mean", "max": "amax", "min": "amin", "mul": "prod"}[reduce]
        res = src.new_zeros(shape).scatter_reduce_(dim, idx, src, red, include_self=False)
    if out is not None:
        out.copy_(res if reduce not in ("sum", "add") else out + res)
        return out
    return res


def scatter_add(src, index, dim=-1, out=None, dim_size=None):
    return scatter(src, index, dim, out, dim_size, "sum")


def scatter_sum(src, index, dim=-1, out=None, dim_size=None):
    return scatter(src, index, dim, out, dim_size, "sum")


def scatter_mean(src, index, dim=-1, out=None, dim_size=None):
    return scatter(src, index, dim, out, dim_size, "mean")


def scatter_max(src, index, dim=-1, out=None, dim_size=None):
    res = scatter(src, index, dim, out, dim_size, "max")
    return res, None  # argmax is not used by fairchem's EquiformerV2 path


def scatter_min(src, index, dim=-1, out=None, dim_size=None):
    res = scatter(src, index, dim, out, dim_size, "min")
    return res, None


def segment_coo(src: torch.Tensor, index: torch.Tensor, out: torch.Tensor | None = None,
                dim_size: int | None = None, reduce: str = "sum") -> torch.Tensor:
    """Reduce rows of ``src`` whose (sorted) ``index`` agree; index spans the leading dims."""
    dim = index.dim() - 1
    if out is not None:
        dim_size = out.shape[dim]
    return scatter(src, index.reshape(-1) if index.dim() == 1 else index, dim, out, dim_size, reduce)


def segment_csr(src: torch.Tensor, indptr: torch.Tensor, out: torch.Tensor | None = None,
                reduce: str = "sum") -> torch.Tensor:
    """Reduce ``src`` rows in [indptr[i], indptr[i+1]) (1-D indptr)."""
    dim = indptr.dim() - 1
    counts = indptr[1:] - indptr[:-1]
    index = torch.repeat_interleave(torch.arange(counts.numel(), device=src.device), counts)
    return scatter(src, index, dim, out, counts.numel(), reduce)


def install() -> None:
    """Register as ``torch_scatter`` unless the real package is importable."""
    if "torch_scatter" in sys.modules:
        return
    try:  # pragma: no cover - the real extension is never installed here
        import importlib.util
        if importlib.util.find_spec("torch_scatter") is not None and \
                importlib.util.find_spec("torch_scatter").origin != __file__:
            return
    except (ImportError, ValueError):
        pass
    sys.modules["torch_scatter"] = sys.modules[__name__]


__version__ = "0.0-stub"
install()
