"""Process-group setup from torchrun's environment and small collectives.

``torchrun --nproc_per_node K train.py ...`` sets RANK / WORLD_SIZE /
LOCAL_RANK / MASTER_ADDR / MASTER_PORT; without them the run is one process.
Backend: nccl when the device is CUDA, gloo on CPU.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any, List

import torch
import torch.distributed as dist

__all__ = ["DistInfo", "setup_distributed", "all_reduce_sum", "broadcast_object", "barrier", "all_gather_object"]


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    owns_group: bool = False

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup_distributed(device: str = "auto") -> DistInfo:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("trainer.device=cuda but no CUDA device is available. Fix: trainer.device=auto or cpu.")
    dev = torch.device("cuda", local) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    owns = False
    if world > 1 and not dist.is_initialized():
        # a peer that died must not leave the others blocked for torch's default 30 minutes forever:
        # EST_DIST_TIMEOUT (seconds) bounds every collective
        timeout = datetime.timedelta(seconds=float(os.environ.get("EST_DIST_TIMEOUT", "1800")))
        dist.init_process_group(backend="nccl" if use_cuda else "gloo", rank=rank, world_size=world, timeout=timeout)
        owns = True
    if dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    return DistInfo(rank=rank, world_size=world, local_rank=local, device=dev, owns_group=owns)


def all_reduce_sum(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Sum over ranks (returns a new tensor; float64 is kept)."""
    if not info.enabled:
        return t
    t = t.clone()
    dev_t = t.to(info.device) if info.device.type == "cuda" else t
    dist.all_reduce(dev_t, op=dist.ReduceOp.SUM)
    return dev_t.to(t.device)


def all_gather_object(obj: Any, info: DistInfo) -> List[Any]:
    if not info.enabled:
        return [obj]
    out: List[Any] = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, info: DistInfo, src: int = 0) -> Any:
    if not info.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()
