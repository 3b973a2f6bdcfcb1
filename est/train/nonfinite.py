"""Non-finite batches: which samples of a batch hold NaN/inf inputs, and what a skipped batch is called.

A batch is skipped on every rank when any rank sees non-finite inputs, a
non-finite loss or a non-finite gradient norm (the trainer decides that
collectively); past ``trainer.max_bad_batches`` skips the run stops with
:class:`NonFiniteLossError`. The messages name the step, the position in the
epoch, the ``sid``/``idx`` of each rank's samples and, for bad inputs, the
fields and the file (and key) each bad sample was read from.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import torch

from .data import sample_source

__all__ = ["NonFiniteLossError", "nonfinite_inputs", "batch_ids", "bad_batch_message"]


class NonFiniteLossError(FloatingPointError):
    """The loss or the gradients became NaN/inf more often than allowed."""


def nonfinite_inputs(batch, dataset, *, max_samples: int = 5) -> Optional[str]:
    """None when every float field of ``batch`` is finite (one host sync), else the bad samples.

    Names, for up to ``max_samples`` samples, the non-finite fields, the
    sample's ``sid``/``idx`` and where it is stored in ``dataset`` (file and
    key for LMDB, row id for ASE databases).
    """
    fields = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor) and v.is_floating_point()}
    if not fields or bool(torch.stack([torch.isfinite(v).all() for v in fields.values()]).all()):
        return None
    bad: Dict[int, List[str]] = {}  # graph -> fields
    slices = getattr(batch, "_slice_dict", {})
    for key, v in fields.items():
        rows = (~torch.isfinite(v)).reshape(v.shape[0], -1).any(dim=1).nonzero().reshape(-1).cpu()  # [R]
        if rows.numel() == 0:
            continue
        if key in slices:
            graphs = torch.searchsorted(slices[key].cpu(), rows, right=True) - 1  # [R]
        else:
            graphs = torch.zeros_like(rows)
        for g in graphs.unique().tolist():
            bad.setdefault(int(g), []).append(key)
    parts = []
    for g in sorted(bad)[:max_samples]:
        sid = int(batch.sid.reshape(-1)[g]) if hasattr(batch, "sid") else None
        idx = int(batch.idx.reshape(-1)[g]) if hasattr(batch, "idx") else None
        where = f" in {sample_source(dataset, idx)}" if idx is not None else ""
        parts.append(f"non-finite {'/'.join(bad[g])} in sample sid={sid} idx={idx}{where}")
    more = f" (and {len(bad) - max_samples} more samples)" if len(bad) > max_samples else ""
    return "; ".join(parts) + more


def batch_ids(batch, detail: Optional[str] = None) -> Dict[str, Any]:
    """This rank's part of a skipped batch's description: ``sid``/``idx`` (first 64) and ``detail``."""
    ids: Dict[str, Any] = {k: getattr(batch, k).reshape(-1).tolist()[:64] for k in ("sid", "idx") if hasattr(batch, k)}
    ids["detail"] = detail
    return ids


def bad_batch_message(what: str, ids: Sequence[Dict[str, Any]], *, step: int, epoch: int, position: int) -> str:
    """``what`` happened at ``step``, with every rank's :func:`batch_ids` (``ids[rank]``)."""
    details = "; ".join(f"rank {r}: {v['detail']}" if len(ids) > 1 else v["detail"] for r, v in enumerate(ids) if v["detail"])
    return (f"{what} at step {step} (epoch {epoch}, batch {position} of the epoch)"
            + (f": {details}" if details else "") + "; batch ids per rank: "
            + "; ".join(f"rank {r}: sid={v.get('sid')} idx={v.get('idx')}" for r, v in enumerate(ids)))
