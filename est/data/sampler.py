"""Atom-balanced batching, one process or distributed.

Every rank builds the same plan: a seeded permutation of the dataset per
epoch, cut into global batches of ``batch_size * num_replicas`` samples; each
global batch is split across ranks greedily (largest sample first, to the rank
with the fewest atoms so far; ties to the rank with fewer samples, then the
lower rank), so ranks get nearly equal atom counts. Atom counts come from the
dataset's stored ``natoms`` (no samples are loaded); without them they are read
once from the samples, with a warning.

Use it as a ``batch_sampler``::

    sampler = BalancedBatchSampler(ds, batch_size_per_rank=8, num_replicas=world, rank=rank)
    loader = torch_geometric.loader.DataLoader(ds, batch_sampler=sampler, num_workers=4)
    for epoch in range(E):
        sampler.set_epoch(epoch)
        for batch in loader: ...

Resuming mid-epoch: save ``sampler.state_dict(batches_done=k)`` (k = batches
the trainer consumed; the sampler's own count runs ahead when workers
prefetch) and call ``load_state_dict`` before iterating; that epoch then starts
at batch k.
"""
from __future__ import annotations

import heapq
import math
import warnings
from typing import Any, Dict, Iterator, List, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import Sampler

__all__ = ["BalancedBatchSampler", "balanced_split", "get_natoms"]


def get_natoms(dataset: Any, *, warn: bool = True) -> np.ndarray:
    """Per-sample atom counts: ``dataset.natoms`` if available, else read from every sample."""
    nat = getattr(dataset, "natoms", None)
    if nat is not None and not callable(nat):
        arr = np.asarray(nat, dtype=np.int64).reshape(-1)
        if arr.shape[0] == len(dataset):
            return arr
    if isinstance(dataset, torch.utils.data.Subset):
        base = get_natoms(dataset.dataset, warn=warn)
        return base[np.asarray(dataset.indices, dtype=np.int64)]
    if warn:
        warnings.warn(
            f"{type(dataset).__name__} has no stored per-sample atom counts ('natoms'); reading all "
            f"{len(dataset)} samples once to get them. Store them (est.data.write_lmdb does; fairchem "
            "folders can carry metadata.npz with 'natoms') or pass natoms= to skip this.",
            stacklevel=3,
        )
    out = np.empty(len(dataset), dtype=np.int64)
    for i in range(len(dataset)):
        s = dataset[i]
        n = getattr(s, "natoms", None)
        out[i] = int(n.reshape(-1)[0]) if isinstance(n, torch.Tensor) else (int(n) if n is not None else s.pos.shape[0])
    return out


def balanced_split(indices: Sequence[int], natoms: np.ndarray, num_parts: int) -> List[List[int]]:
    """Split ``indices`` into ``num_parts`` lists of nearly equal total atoms (greedy LPT).

    Samples are taken largest first (ties by position) and each goes to the
    part with the fewest atoms, then fewest samples, then lowest number. Given
    at least ``num_parts`` samples, every part gets one.
    """
    idx = np.asarray(indices, dtype=np.int64)
    sizes = natoms[idx]
    order = np.argsort(-sizes, kind="stable")
    heap = [(0, 0, r) for r in range(num_parts)]
    parts: List[List[int]] = [[] for _ in range(num_parts)]
    for k in order:
        atoms, count, r = heapq.heappop(heap)
        parts[r].append(int(idx[k]))
        heapq.heappush(heap, (atoms + int(sizes[k]), count + 1, r))
    return parts


class BalancedBatchSampler(Sampler[List[int]]):
    """Batch sampler giving each rank nearly equal atoms (see module docstring).

    Args:
        dataset: the dataset (its ``natoms`` is used when ``natoms`` is None).
        batch_size_per_rank: samples per rank per step (global batch = batch_size_per_rank x
            num_replicas). The trainer's :class:`est.train.sampler.GlobalBatchSampler` takes the
            global batch instead (``global_batch_size``); the names say which.
        natoms: per-sample atom counts, overriding the dataset's.
        num_replicas, rank: default to torch.distributed's world, else 1 and 0.
        shuffle, seed: seeded permutation per epoch (``set_epoch``).
        drop_last: drop the last incomplete global batch; otherwise it is
            padded with samples from the start of the epoch's order so every
            rank gets at least one sample.
    """

    def __init__(
        self,
        dataset: Any,
        *,
        batch_size_per_rank: Optional[int] = None,
        natoms: Optional[Sequence[int]] = None,
        num_replicas: Optional[int] = None,
        rank: Optional[int] = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        **renamed: Any,
    ):
        if "batch_size" in renamed:
            raise TypeError("BalancedBatchSampler: batch_size was renamed batch_size_per_rank (samples per rank "
                            "per step; est.train.sampler.GlobalBatchSampler takes global_batch_size)")
        if renamed:
            raise TypeError(f"BalancedBatchSampler got unexpected keyword arguments {sorted(renamed)}")
        if batch_size_per_rank is None:
            raise TypeError("BalancedBatchSampler needs batch_size_per_rank= (samples per rank per step)")
        batch_size = batch_size_per_rank
        if batch_size < 1:
            raise ValueError(f"batch_size_per_rank must be >= 1, got {batch_size}")
        if num_replicas is None or rank is None:
            dist = torch.distributed
            ready = dist.is_available() and dist.is_initialized()
            num_replicas = num_replicas if num_replicas is not None else (dist.get_world_size() if ready else 1)
            rank = rank if rank is not None else (dist.get_rank() if ready else 0)
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, {num_replicas})")
        self.dataset = dataset
        self.natoms = np.asarray(natoms, dtype=np.int64) if natoms is not None else get_natoms(dataset)
        if self.natoms.shape[0] != len(dataset):
            raise ValueError(f"natoms has {self.natoms.shape[0]} entries for {len(dataset)} samples")
        if len(dataset) == 0:
            raise ValueError("cannot sample from an empty dataset")
        self.batch_size = batch_size
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self.start_batch = 0
        self._yielded = 0

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.num_replicas

    def _num_batches(self) -> int:
        n = len(self.natoms)
        if self.drop_last:
            return n // self.global_batch_size
        return math.ceil(n / self.global_batch_size)

    def __len__(self) -> int:
        return max(0, self._num_batches() - self.start_batch)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's permutation; a pending resume point applies only to its own epoch."""
        if epoch != self.epoch:
            self.start_batch = 0
        self.epoch = epoch

    def order(self) -> np.ndarray:
        n = len(self.natoms)
        if not self.shuffle:
            return np.arange(n, dtype=np.int64)
        return np.random.RandomState((self.seed * 1_000_003 + self.epoch) % (2**32)).permutation(n)

    def global_batches(self) -> Iterator[List[List[int]]]:
        """All ranks' parts of each global batch of the epoch, from ``start_batch``."""
        order = self.order()
        G, W = self.global_batch_size, self.num_replicas
        for b in range(self.start_batch, self._num_batches()):
            chunk = order[b * G : (b + 1) * G]
            if len(chunk) < W:  # pad so every rank gets a sample
                chunk = np.concatenate([chunk, np.resize(order, W - len(chunk))])
            yield balanced_split(chunk, self.natoms, W)

    def __iter__(self) -> Iterator[List[int]]:
        self._yielded = self.start_batch
        for parts in self.global_batches():
            self._yielded += 1
            yield parts[self.rank]
        self.start_batch = 0  # the next pass is a fresh epoch

    def state_dict(self, batches_done: Optional[int] = None) -> Dict[str, int]:
        """Resume point: epoch and batches done in it (default: batches yielded so far)."""
        return {"epoch": self.epoch, "batches_done": self._yielded if batches_done is None else int(batches_done),
                "seed": self.seed, "num_replicas": self.num_replicas, "batch_size": self.batch_size}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        for key in ("num_replicas", "batch_size"):
            if key in state and state[key] != getattr(self, key):
                warnings.warn(f"resuming with {key}={getattr(self, key)} but the state has {state[key]}: "
                              "the batch plan differs from the saved run")
        self.epoch = int(state["epoch"])
        self.seed = int(state.get("seed", self.seed))
        self.start_batch = int(state["batches_done"])
