"""Evaluation of a model on a dataset: a plain function of (model, task, data) that the trainer and
``mode=eval`` both call."""
from __future__ import annotations

import contextlib
from typing import Dict, List

import numpy as np
import torch
from torch import nn

from .data import Prefetcher, dataset_natoms, make_loader
from .distributed import DistInfo, all_gather_object, all_reduce_sum
from .sampler import GlobalBatchSampler

__all__ = ["evaluate"]


def evaluate(module: nn.Module, task, ds, *, data, info: DistInfo, grad: bool = False, amp: bool = False,
         prefetch: bool = True, collect: bool = False):
    """Metrics of ``module`` on dataset ``ds`` (``task.finalize`` of the summed batch statistics, all ranks
    reduced); with ``collect``, also the predictions gathered from every rank, in dataset order.

    ``data``: the data config (batch sizes, sampler, workers); ``grad``: evaluate with autograd on
    (gradient forces); ``amp``: bf16 autocast on CUDA. Used by the trainer and by ``mode=eval``.
    """
    d = data
    sampler = GlobalBatchSampler(len(ds), global_batch_size=d.eval_batch_size or d.batch_size, rank=info.rank,
                                 world_size=info.world_size,
                                 natoms=dataset_natoms(ds) if d.sampler == "balanced" and info.world_size > 1 else None,
                                 balanced=d.sampler == "balanced", shuffle=False, train=False)
    loader = make_loader(ds, sampler, num_workers=d.num_workers, pin_memory=info.device.type == "cuda")
    was_training = module.training
    module.eval()
    sums: Dict[str, torch.Tensor] = {}
    preds: List[Dict[str, np.ndarray]] = []
    grad_ctx = torch.enable_grad if grad else torch.no_grad
    autocast = (lambda: torch.autocast(device_type="cuda", dtype=torch.bfloat16)) if amp else contextlib.nullcontext
    for batch in Prefetcher(loader, info.device, enabled=prefetch):
        with grad_ctx(), autocast():
            out = module(batch)
        out = {k: v.detach().float() for k, v in out.items()}
        task.check_output(out, batch)
        task.accumulate(sums, out, batch)
        if collect:
            preds.append(task.predictions(out, batch))
    module.train(was_training)
    keys = sorted(set().union(*all_gather_object(sorted(sums), info)))
    vec = torch.stack([sums[k].detach().double().cpu() if k in sums else torch.zeros((), dtype=torch.float64) for k in keys]) \
        if keys else torch.zeros(0, dtype=torch.float64)
    vec = all_reduce_sum(vec, info)
    metrics = task.finalize({k: float(v) for k, v in zip(keys, vec)})
    if not collect:
        return metrics
    gathered = all_gather_object(preds, info)
    merged: Dict[str, np.ndarray] = {}
    flat = [p for part in gathered for p in part]
    if flat:
        for k in flat[0]:
            merged[k] = np.concatenate([p[k] for p in flat])
        if "idx" in merged and "forces_true" not in merged:
            order = np.argsort(merged["idx"], kind="stable")
            merged = {k: v[order] for k, v in merged.items()}
    return metrics, merged
