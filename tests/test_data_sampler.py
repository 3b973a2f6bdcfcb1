"""Atom-balanced batch sampler: per-rank atom spread, coverage, determinism, resume, loaders."""
import warnings

import numpy as np
import pytest
import torch

from est.data import BalancedBatchSampler, balanced_split, make_sample, write_lmdb, LmdbDataset


class _Sized:
    def __init__(self, natoms):
        self.natoms = np.asarray(natoms)

    def __len__(self):
        return len(self.natoms)


class _NoMeta:
    """A dataset without stored atom counts."""

    def __init__(self, natoms):
        self._n = list(natoms)

    def __len__(self):
        return len(self._n)

    def __getitem__(self, i):
        k = self._n[i]
        return make_sample(pos=torch.zeros(k, 3), atomic_numbers=torch.ones(k, dtype=torch.long), idx=i)


def test_balanced_split_spread():
    rng = np.random.default_rng(0)
    natoms = rng.integers(5, 120, size=256)
    parts = balanced_split(np.arange(256), natoms, 8)
    loads = [natoms[p].sum() for p in parts]
    assert max(loads) - min(loads) <= natoms.max()  # greedy LPT bound
    assert sorted(sum(parts, [])) == list(range(256))
    # nearly equal: spread is a small fraction of the mean load
    assert (max(loads) - min(loads)) / np.mean(loads) < 0.05


def test_ranks_partition_epoch_and_are_balanced():
    rng = np.random.default_rng(1)
    natoms = rng.integers(3, 200, size=1001)
    ds = _Sized(natoms)
    W, B = 4, 16
    per_rank = [list(BalancedBatchSampler(ds, batch_size_per_rank=B, num_replicas=W, rank=r, seed=3)) for r in range(W)]
    assert len({len(b) for b in per_rank}) == 1  # same number of steps on every rank
    seen = [i for r in range(W) for batch in per_rank[r] for i in batch]
    assert set(seen) == set(range(1001))  # everything once (+ padding of the last batch)
    assert len(seen) - 1001 < W
    spreads, naive = [], []
    order = np.random.RandomState(0).permutation(1001)
    for step in range(len(per_rank[0]) - 1):
        loads = [natoms[per_rank[r][step]].sum() for r in range(W)]
        assert all(len(per_rank[r][step]) > 0 for r in range(W))
        spreads.append(max(loads) - min(loads))
        chunk = order[step * W * B:(step + 1) * W * B].reshape(W, B)
        naive.append(np.ptp(natoms[chunk].sum(1)))
    assert np.mean(spreads) < 0.1 * np.mean(naive)  # far better than equal-count splits
    assert max(spreads) <= natoms.max()


def test_epochs_shuffle_deterministically_and_resume():
    ds = _Sized(np.arange(1, 101))
    s = BalancedBatchSampler(ds, batch_size_per_rank=4, num_replicas=2, rank=1, seed=7)
    s.set_epoch(0)
    e0 = list(s)
    s.set_epoch(1)
    e1 = list(s)
    assert e0 != e1
    s.set_epoch(0)
    assert list(s) == e0
    # resume after 5 batches of epoch 0
    state = s.state_dict(batches_done=5)
    t = BalancedBatchSampler(ds, batch_size_per_rank=4, num_replicas=2, rank=1, seed=0)
    t.load_state_dict(state)
    t.set_epoch(0)
    assert len(t) == len(e0) - 5
    assert list(t) == e0[5:]
    assert list(t) == e0  # the next pass is a whole epoch again


def test_drop_last_and_single_process():
    ds = _Sized(np.full(10, 3))
    s = BalancedBatchSampler(ds, batch_size_per_rank=4, shuffle=False, drop_last=True)
    batches = list(s)
    assert len(batches) == len(s) == 2 and all(len(b) == 4 for b in batches)
    s2 = BalancedBatchSampler(ds, batch_size_per_rank=4, shuffle=False)
    assert [len(b) for b in s2] == [4, 4, 2]


def test_without_metadata_warns_and_reads_counts():
    ds = _NoMeta([3, 9, 4, 7, 2, 8])
    with pytest.warns(UserWarning, match="no stored per-sample atom counts"):
        s = BalancedBatchSampler(ds, batch_size_per_rank=3, num_replicas=2, rank=0, shuffle=False)
    assert s.natoms.tolist() == [3, 9, 4, 7, 2, 8]


def test_with_pyg_dataloader(tmp_path):
    from torch_geometric.loader import DataLoader

    samples = [make_sample(pos=torch.randn(k, 3), atomic_numbers=torch.ones(k, dtype=torch.long), energy=1.0)
               for k in [3, 5, 8, 2, 9, 4, 6, 7]]
    write_lmdb(tmp_path / "d", samples)
    ds = LmdbDataset(tmp_path / "d")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # natoms are stored: no warning
        sampler = BalancedBatchSampler(ds, batch_size_per_rank=2, num_replicas=2, rank=0)
    loader = DataLoader(ds, batch_sampler=sampler)
    batches = list(loader)
    assert len(batches) == 2 and all(b.natoms.sum() == b.pos.shape[0] for b in batches)


def test_balanced_sampler_names_its_batch_size_per_rank():
    ds = list(range(8))
    with pytest.raises(TypeError, match="batch_size was renamed batch_size_per_rank"):
        BalancedBatchSampler(ds, batch_size=4, natoms=[3] * 8, num_replicas=1, rank=0)
