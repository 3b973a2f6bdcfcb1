"""Datasets, per-rank loaders and asynchronous prefetching for training.

Datasets come from :mod:`est.data` (``QM9``; for the other tasks the reader the
path calls for, :func:`est.data.formats.open_dataset`: OC20 ``.lmdb``, fairchem
``.aselmdb``, ASE ``.db``); any
``Sequence[Data]`` of canonical samples (CONVENTIONS.md) also works, which is
how the tests train on in-memory data.

Every rank builds its own loader over its share of each global batch
(:class:`~est.train.sampler.GlobalBatchSampler`) and reads the files directly;
no central dispatcher. :class:`Prefetcher` prepares the next batch while the
current step runs: a background thread on CPU; on GPU the thread also copies
the (pinned) batch to the device on a side CUDA stream, and the step waits on
an event, never on I/O. It records the time the training loop spent waiting.
"""
from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
import warnings
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader, Dataset
from torch_geometric.data import Batch

from .sampler import GlobalBatchSampler

__all__ = ["IndexSubset", "build_datasets", "dataset_natoms", "make_loader", "Prefetcher", "collate",
           "resolve_model_stats", "training_elements", "sample_source", "ELEMENT_SAMPLES"]

#: training samples read (at most, at random) to find the training elements of datasets without metadata
ELEMENT_SAMPLES = 2000
#: the columns of ``est.data.QM9.composition()``
QM9_COMPOSITION_ELEMENTS = (1, 6, 7, 8, 9)


class IndexSubset(Dataset):
    """``dataset[indices]`` keeping ``natoms`` for balanced batching."""

    def __init__(self, dataset, indices: Sequence[int]):
        self.dataset = dataset
        self.indices = np.asarray(indices, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        return self.dataset[int(self.indices[i])]

    @property
    def natoms(self) -> Optional[np.ndarray]:
        n = dataset_natoms(self.dataset, compute=False)
        return None if n is None else n[self.indices]


def dataset_natoms(dataset, *, compute: bool = True, limit: int = 200_000) -> Optional[np.ndarray]:
    """Per-sample atom counts: ``dataset.natoms`` or, for small datasets, counted."""
    n = getattr(dataset, "natoms", None)
    if n is not None and not callable(n):
        return np.asarray(n, dtype=np.int64).reshape(-1)
    if not compute or len(dataset) > limit:
        return None
    return np.asarray([int(dataset[i].num_nodes) for i in range(len(dataset))], dtype=np.int64)


def _random_indices(n: int, max_samples: int, seed: int) -> List[int]:
    """``range(n)`` when ``n <= max_samples``, else ``max_samples`` distinct indices drawn with ``seed``."""
    if n <= max_samples:
        return list(range(n))
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:max_samples].tolist()


def training_elements(dataset, *, max_samples: int = ELEMENT_SAMPLES, seed: int = 0) -> Tuple[List[int], str]:
    """``(sorted atomic numbers seen in training, where they come from)``.

    Cheapest source first: a dataset's own ``elements`` (metadata: a sequence
    of atomic numbers), QM9's ``composition()`` (element counts of every
    molecule, no sample is read), else the union of ``atomic_numbers`` over
    all samples, or over ``max_samples`` random ones for a larger set (then
    a rare element can be missing: the calculator refuses it, the safe side).
    """
    meta = getattr(dataset, "elements", None)
    if meta is not None and not callable(meta):
        return sorted({int(z) for z in meta}), f"{type(dataset).__name__}.elements"
    from est.data.qm9 import QM9

    if isinstance(dataset, QM9):
        counts = np.asarray(dataset.composition())  # [M, 5] counts of H, C, N, O, F (QM9.composition's columns)
        seen = counts.sum(axis=0) > 0
        return [z for z, s in zip(QM9_COMPOSITION_ELEMENTS, seen) if s], f"composition of all {len(dataset)} training molecules"
    n = len(dataset)
    idx = _random_indices(n, max_samples, seed)
    seen: set = set()
    for i in idx:
        seen.update(int(z) for z in torch.as_tensor(dataset[i].atomic_numbers).reshape(-1).unique().tolist())
    where = f"all {n} training samples" if len(idx) == n else f"{len(idx)} random training samples of {n}"
    return sorted(seen), where


def _innermost(dataset):
    while isinstance(dataset, IndexSubset):
        dataset = dataset.dataset
    return dataset


def sample_source(dataset, idx: int) -> str:
    """Where sample ``idx`` (its ``idx`` field: the index in the innermost dataset) is stored, for messages."""
    ds = _innermost(dataset)
    try:
        if callable(getattr(ds, "locate", None)):  # LMDB: file and key
            f, key = ds.locate(int(idx))
            return f"{ds.files[f]} key {key!r}"
        if hasattr(ds, "ids") and hasattr(ds, "path"):  # ASE database: file and row id
            return f"{ds.path} row id {int(ds.ids[int(idx)])}"
        if hasattr(ds, "path"):
            return str(ds.path)
    except Exception:  # a message helper must never raise
        pass
    return repr(ds) if not isinstance(ds, (list, tuple)) else "in-memory dataset"


def collate(samples: List[Any]) -> Batch:
    return Batch.from_data_list(samples)


def _subset_fraction(subset: Optional[float], n_train: int) -> Optional[float]:
    if subset is None:
        return None
    return float(subset) if subset <= 1.0 else min(1.0, float(subset) / max(n_train, 1))


def _take(ds, frac: Optional[float], seed: int):
    if frac is None or frac >= 1.0:
        return ds
    k = max(1, int(round(len(ds) * frac)))
    idx = torch.randperm(len(ds), generator=torch.Generator().manual_seed(seed))[:k].sort().values.numpy()
    return IndexSubset(ds, idx)


def _maybe_generate(dcfg, info) -> None:
    if not dcfg.generate or dcfg.train_path is None or os.path.exists(dcfg.train_path):
        return
    out = dcfg.generate_dir or os.path.dirname(os.path.dirname(os.path.abspath(dcfg.train_path)))
    if info.is_main:
        cmd = [sys.executable, "-m", dcfg.generator, "--out", out, *map(str, dcfg.generate_args)]
        print(f"[est.train] {dcfg.train_path} is missing: generating the set: {' '.join(cmd)}", flush=True)
        res = subprocess.run(cmd)
        if res.returncode != 0:
            raise RuntimeError(f"'{' '.join(cmd)}' failed (exit {res.returncode}). Fix: generate the set by hand or "
                               "pass data.train_path/data.val_path of an existing OC20-layout LMDB.")
    from .distributed import barrier
    barrier(info)
    for key in ("train_path", "val_path", "test_path"):
        p = getattr(dcfg, key)
        if p is not None and not os.path.exists(p):
            raise FileNotFoundError(f"data.{key}={p} is still missing after generating into {out}. "
                                    f"Fix: check the generator's output layout and set data.{key}.")


def hold_out_tail(dataset, fraction: float) -> Tuple[IndexSubset, IndexSubset]:
    """(head, tail) of ``dataset`` in its own order, the tail ``max(1, round(n * fraction))`` samples long.

    The validation split of ``data.val_fraction``: consecutive MD frames are correlated (the xTB sets'
    forces decorrelate over ~5 MD steps, energies over ~70, geometries over ~400), so the tail of a
    trajectory is a fairer hold-out than frames drawn at random between training frames.
    """
    n = len(dataset)
    k = max(1, int(round(n * fraction)))
    if n - k < 1:
        raise ValueError(f"data.val_fraction={fraction} of {n} training samples leaves none to train on. "
                         "Fix: a smaller data.val_fraction or a data.val_path.")
    return IndexSubset(dataset, np.arange(n - k)), IndexSubset(dataset, np.arange(n - k, n))


def build_datasets(dcfg, info, splits: Sequence[str] = ("train", "val", "test")) -> Dict[str, Dataset]:
    """Datasets for the requested splits (QM9, or files by path: LMDB, .aselmdb, ASE db), with ``data.subset`` applied."""
    out: Dict[str, Dataset] = {}
    if dcfg.task == "qm9":
        try:
            from est.data import QM9  # type: ignore[attr-defined]
        except ImportError:
            from est.data.qm9 import QM9
        from .distributed import barrier
        subset = None if dcfg.subset is None else (int(dcfg.subset) if dcfg.subset > 1 else float(dcfg.subset))
        kw = dict(source=dcfg.source, subset=subset, seed=dcfg.split_seed,
                  atomref="fit" if dcfg.atomref == "fit" else "b3lyp")
        if dcfg.cache_dir is not None:
            kw["cache_dir"] = dcfg.cache_dir
        # rank 0 processes (and caches) first, the others then read the cache
        for turn in ((0,), tuple(range(1, info.world_size))):
            if info.rank in turn:
                for s in splits:
                    out[s] = QM9(dcfg.root, split=s, verbose=info.is_main and s == splits[0], **kw)
            barrier(info)
        return out
    from est.data.formats import open_dataset

    _maybe_generate(dcfg, info)
    held_out = getattr(dcfg, "val_fraction", None) is not None and dcfg.val_path is None
    paths = {"train": dcfg.train_path, "val": dcfg.train_path if held_out else dcfg.val_path, "test": dcfg.test_path}
    key_map = OmegaConf.to_container(dcfg.key_map) if isinstance(dcfg.key_map, DictConfig) else dict(dcfg.key_map or {})
    opened: Dict[str, Dataset] = {}  # path -> dataset: a held-out validation tail shares its training file's reader

    def split_of(s: str) -> Dataset:
        p = paths[s]
        if p not in opened:
            # the reader follows the path (OC20 .lmdb, fairchem .aselmdb, ASE .db/.json: est.data.formats);
            # non-finite positions/cells reach the trainer, which names the file and key and skips
            # them under trainer.max_bad_batches (Trainer.nonfinite_inputs). No extra fields (.aselmdb
            # stress/charge/spin): no task reads them, and rows with and without one cannot share a batch
            opened[p] = open_dataset(p, key_map=key_map or None, trusted=dcfg.trusted, check_finite=False, extra_fields=())
        if held_out and s in ("train", "val"):
            return hold_out_tail(opened[p], dcfg.val_fraction)[s == "val"]
        return opened[p]

    frac = None
    for s in ("train", "val", "test"):
        if s not in splits or paths[s] is None:
            continue
        ds = split_of(s)
        if s == "train" or frac is None:
            frac = _subset_fraction(dcfg.subset, len(ds)) if s == "train" or "train" not in splits else frac
        out[s] = _take(ds, frac, seed=dcfg.split_seed + {"train": 0, "val": 1, "test": 2}[s])
    return out


def make_loader(dataset, sampler: GlobalBatchSampler, *, num_workers: int = 0, pin_memory: bool = False) -> DataLoader:
    # an own generator: creating an iterator (e.g. when resuming mid-epoch) must not draw from the global RNG
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=collate, num_workers=num_workers,
                      pin_memory=pin_memory, persistent_workers=False, generator=torch.Generator().manual_seed(0))


_END = object()


class Prefetcher:
    """Iterate ``loader`` one step ahead in a background thread (see module docstring).

    ``wait_s`` accumulates the time the consumer waited for a batch.
    """

    def __init__(self, loader, device: torch.device, *, enabled: bool = True):
        self.loader = loader
        self.device = device
        self.enabled = enabled
        self.wait_s = 0.0
        self.stream = torch.cuda.Stream(device) if (enabled and device.type == "cuda") else None

    def _to_device(self, b):
        return b.to(self.device, non_blocking=True) if self.device.type == "cuda" else b

    def __iter__(self) -> Iterator[Batch]:
        if not self.enabled:
            it = iter(self.loader)
            while True:
                t0 = time.perf_counter()
                try:
                    b = next(it)
                except StopIteration:
                    return
                b = self._to_device(b)
                self.wait_s += time.perf_counter() - t0
                yield b
            return
        q: "queue.Queue" = queue.Queue(maxsize=1)
        stop = threading.Event()

        def put(item) -> bool:
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def work():
            try:
                for b in self.loader:
                    ev = None
                    if self.stream is not None:
                        with torch.cuda.stream(self.stream):
                            b = b.to(self.device, non_blocking=True)
                            ev = torch.cuda.Event()
                            ev.record(self.stream)
                    if not put((b, ev)):
                        return
                put(_END)
            except BaseException as exc:  # surfaced in the consumer
                put(exc)

        th = threading.Thread(target=work, name="est-prefetch", daemon=True)
        th.start()
        try:
            while True:
                t0 = time.perf_counter()
                item = q.get()
                self.wait_s += time.perf_counter() - t0
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                b, ev = item
                if ev is not None:
                    cur = torch.cuda.current_stream(self.device)
                    cur.wait_event(ev)
                    for store in b.stores:
                        for v in store.values():
                            if isinstance(v, torch.Tensor) and v.is_cuda:
                                v.record_stream(cur)
                yield b
        finally:
            stop.set()
            try:
                while True:
                    q.get_nowait()
            except queue.Empty:
                pass
            th.join(timeout=5.0)


def resolve_model_stats(model_cfg: Dict[str, Any], train_ds, *, max_samples: int = 500, seed: int = 0) -> Dict[str, Any]:
    """Replace ``avg_num_nodes: auto`` / ``avg_degree: auto`` in the model config by training-set statistics.

    avg_num_nodes = mean atoms per sample; avg_degree = mean incoming edges per
    atom of the radius graph the model builds (model.cutoff, model.max_neighbors,
    model.neighbor_tie_mode, PBC when model.use_pbc; unset keys take the named
    preset's values) over up to ``max_samples`` samples.
    """
    cfg = dict(model_cfg)
    want_n, want_d = cfg.get("avg_num_nodes") == "auto", cfg.get("avg_degree") == "auto"
    if not (want_n or want_d):
        return cfg
    samples = [train_ds[i] for i in _random_indices(len(train_ds), max_samples, seed)]
    if want_n:
        nat = dataset_natoms(train_ds, compute=False)
        cfg["avg_num_nodes"] = float(np.mean(nat)) if nat is not None else float(np.mean([s.num_nodes for s in samples]))
    if want_d:
        from est.geometry import radius_graph

        keys = ("cutoff", "max_neighbors", "use_pbc", "neighbor_tie_mode")
        graph = {k: cfg[k] for k in keys if k in cfg}
        if len(graph) < len(keys) and not cfg.get("_target_"):
            try:  # the named preset's values for what the config does not set
                from est.models import model_config

                preset = model_config(cfg["name"])
                graph = {k: graph.get(k, getattr(preset, k)) for k in keys}
            except Exception:
                pass
        if "cutoff" not in graph:
            from .config import ConfigError

            raise ConfigError("model.avg_degree=auto needs the model's cutoff. Fix: set model.cutoff, or a number for model.avg_degree.")
        b = Batch.from_data_list(samples)
        pbc = b.pbc if graph.get("use_pbc", False) else torch.zeros_like(b.pbc)
        # the model's own neighbour rule: est models keep ties ("include"); radius_graph's default is "strict"
        g = radius_graph(b.pos, float(graph["cutoff"]), b.batch, cell=b.cell, pbc=pbc, max_neighbors=graph.get("max_neighbors"),
                         tie_mode=graph.get("neighbor_tie_mode", "strict"))
        cfg["avg_degree"] = float(g.edge_index.shape[1]) / float(b.num_nodes)
    return cfg
