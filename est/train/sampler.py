"""Global batches split across ranks, resumable mid-epoch.

One *global* batch (``global_batch_size`` samples, the same on every rank) is
drawn per optimiser step from a permutation seeded by ``(seed, epoch)``; each
rank takes its share:

* ``balanced=True``: greedy by atom count (largest sample to the rank with the
  fewest atoms so far; ties to the lowest rank), so ranks carry nearly equal
  atoms (fairchem's load balancing, without a central dispatcher);
* ``balanced=False``: strided (``batch[rank::world]``).

Training drops a last global batch smaller than the world size (every rank must
step). Evaluation (``train=False``) keeps every sample exactly once, so a rank
may get fewer (or no) samples in the last batch; empty shares are skipped.

State (``epoch``, ``position`` = global batches already consumed) lives in
:meth:`state_dict`; :meth:`set_position` makes the next iteration start after
the consumed batches, which is how a resumed run continues mid-epoch exactly.
"""
from __future__ import annotations

from typing import Dict, Iterator, List, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import Sampler

__all__ = ["GlobalBatchSampler", "split_balanced"]


def split_balanced(indices: Sequence[int], natoms: Sequence[int], world_size: int) -> List[List[int]]:
    """Split ``indices`` (with their atom counts ``natoms``) over ranks with nearly equal atom sums.

    Uses :func:`est.data.balanced_split` (greedy, largest sample to the lightest rank).
    """
    from est.data.sampler import balanced_split

    local = np.asarray(natoms, dtype=np.int64)
    parts = balanced_split(np.arange(len(local)), local, world_size)
    idx = np.asarray(indices, dtype=np.int64)
    return [[int(idx[i]) for i in sorted(p)] for p in parts]


class GlobalBatchSampler(Sampler[List[int]]):
    def __init__(
        self,
        n: int,
        *,
        global_batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        natoms: Optional[Sequence[int]] = None,
        balanced: bool = True,
        shuffle: bool = True,
        seed: int = 0,
        train: bool = True,
    ):
        if global_batch_size < world_size and train:
            raise ValueError(f"data.batch_size={global_batch_size} is smaller than the number of processes ({world_size}); "
                             "it is the global batch. Fix: set data.batch_size >= world size.")
        self.n = int(n)
        self.global_batch_size = int(global_batch_size)
        self.rank, self.world_size = int(rank), int(world_size)
        self.natoms = None if natoms is None else np.asarray(natoms, dtype=np.int64)
        self.balanced = balanced and self.natoms is not None
        self.shuffle = shuffle
        self.seed = int(seed)
        self.train = train
        self.epoch = 0
        self.position = 0

    # -- epoch structure
    def global_batches(self, epoch: Optional[int] = None) -> List[np.ndarray]:
        epoch = self.epoch if epoch is None else epoch
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
            perm = torch.randperm(self.n, generator=g).numpy()
        else:
            perm = np.arange(self.n)
        B = self.global_batch_size
        batches = [perm[i : i + B] for i in range(0, self.n, B)]
        if self.train and batches and len(batches[-1]) < max(self.world_size, 1) :
            batches.pop()
        return batches

    def num_batches(self) -> int:
        """Global batches (= optimiser steps) per epoch."""
        B = self.global_batch_size
        full, rest = divmod(self.n, B)
        return full + (1 if rest and (not self.train or rest >= self.world_size) else 0)

    def share(self, batch: np.ndarray) -> List[int]:
        if self.world_size == 1:
            return [int(i) for i in batch]
        if self.balanced:
            return split_balanced(batch, self.natoms[batch], self.world_size)[self.rank]
        return [int(i) for i in batch[self.rank :: self.world_size]]

    def __iter__(self) -> Iterator[List[int]]:
        for b in self.global_batches()[self.position :]:
            s = self.share(b)
            if s:
                yield s

    def __len__(self) -> int:
        return max(0, self.num_batches() - self.position)

    # -- state
    def set_epoch(self, epoch: int, position: int = 0) -> None:
        self.epoch, self.position = int(epoch), int(position)

    def state_dict(self) -> Dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        self.seed = int(state.get("seed", self.seed))
        self.set_epoch(state["epoch"], state["position"])
