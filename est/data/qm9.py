"""QM9 from real, offline sources as canonical samples.

>>> ds = QM9(split="train")                   # qm9pack CSVs (pip install qm9pack)
>>> ds = QM9("path/to/pyg_root", split="val") # PyG raw folder (root or root/raw)
>>> ds = QM9("dsgdb9nsd.xyz.tar.bz2")         # the original release

Samples carry ``y`` [1, 19]: PyG's targets in PyG's order and units
(:data:`TARGET_NAMES`, :data:`TARGET_UNITS`: energies in eV, Hartree x
27.211386246). Molecules keep the gdb order (sorted by index), which is
PyG's order, with the 3,054 uncharacterised molecules removed (130,831 left).

Split (``split="train"|"val"|"test"``): ``np.random.RandomState(seed)
.permutation(n)``; the first 110,000 train, the next 10,000 val, the rest test
(for a source with n != 130,831 molecules, the same proportions).
``subset`` (int count or float fraction) keeps the first part of each split's
permuted indices in the same proportions: deterministic and nested.

Atom references (targets 7-10, U0, U, H, G): :meth:`QM9.atomref` returns a
[100] tensor of per-element energies in eV. ``atomref="b3lyp"`` (default) are
QM9's free-atom B3LYP/6-31G(2df,p) energies (the release's atomref table, as
PyG); with them ``y[:, 7] - sum(atomref[z]) == y[:, 12]``. ``atomref="fit"``
fits per-element references by least squares on the training split.
Note float32 resolution: at |U0| ~ 11,000 eV one float32 step is ~1 meV, so
learn targets 12-15 (or subtract references in float64) for meV accuracy.

Processed arrays are cached as ``.npz`` (no pickle) under the cache folder
(:func:`est.data.cache.default_cache_dir`), keyed by the source files' paths,
sizes and times and by the options, written atomically, and reused.
"""
from __future__ import annotations

import glob
import os
import sys
import time
import warnings
from typing import Dict, Iterable, List, Optional, Set, Tuple, Union

import numpy as np
import torch
from torch.utils.data import Dataset

from .cache import atomic_savez, cache_key, default_cache_dir, file_signature, is_inside
from .qm9_formats import (
    B3LYP_ATOM_ENERGIES, HAR2EV, QM9_RELEASE_PART, QM9PACK_PARTS, TARGET_NAMES, TARGET_UNITS, Record,
    qm9_gaps, qm9pack_data_dir,
    read_pyg_raw, read_qm9pack_csv, read_uncharacterized, read_xyz_folder, read_xyz_tar,
    shipped_uncharacterized, to_pyg_targets,
)
from .sample import make_sample

__all__ = ["QM9", "qm9_split", "TARGET_NAMES", "TARGET_UNITS", "QM9_SIZE", "STANDARD_SPLIT"]

QM9_SIZE = 130_831
STANDARD_SPLIT = (110_000, 10_000)
_PROCESS_VERSION = 1
_ELEMENTS = (1, 6, 7, 8, 9)


def qm9_split(n: int, seed: int = 0, sizes: Tuple[int, int] = STANDARD_SPLIT) -> Dict[str, np.ndarray]:
    """Seeded train/val/test index arrays for ``n`` molecules (see module docstring)."""
    perm = np.random.RandomState(seed).permutation(n)
    if n == QM9_SIZE:
        n_train, n_val = sizes
    else:
        n_train = int(round(n * sizes[0] / QM9_SIZE))
        n_val = int(round(n * sizes[1] / QM9_SIZE))
    return {
        "train": perm[:n_train],
        "val": perm[n_train : n_train + n_val],
        "test": perm[n_train + n_val :],
    }


def _subset_count(size: int, subset: Union[int, float], total: int) -> int:
    """How many of a split's ``size`` molecules a ``subset`` keeps (int: total count, float: fraction)."""
    if isinstance(subset, bool) or not isinstance(subset, (int, float, np.integer, np.floating)):
        raise TypeError(f"subset must be an int (molecules) or a float fraction, got {subset!r}")
    if isinstance(subset, (float, np.floating)):
        if not 0.0 < subset <= 1.0:
            raise ValueError(f"a float subset is a fraction in (0, 1], got {subset}")
        frac = float(subset)
    else:
        if subset < 1:
            raise ValueError(f"subset must be >= 1 molecule, got {subset}")
        frac = min(1.0, float(subset) / total)
    return min(size, max(1, int(round(size * frac)))) if size else 0


class QM9(Dataset):
    """QM9 molecules as :mod:`est.data.sample` samples (see module docstring).

    Args:
        root: a PyG QM9 root or raw folder, an xyz tarball or folder, or a
            folder of qm9pack-format CSVs; None uses the installed qm9pack.
        source: ``"auto"`` (detect; the choice is in :attr:`source` and
            printed when ``verbose``), ``"qm9pack"``, ``"pyg"``, ``"xyz"``.
        split: ``"train"``, ``"val"``, ``"test"`` or None / ``"all"``.
        subset: keep this many molecules in total (int) or this fraction
            (float <= 1), split proportions preserved.
        seed: split seed.
        atomref: ``"b3lyp"`` or ``"fit"`` (see :meth:`atomref`).
        uncharacterized: path of an ``uncharacterized.txt`` to exclude; by
            default the source's own file, else the list shipped with est.
        cache_dir: where processed arrays go (default: ``$EST_CACHE_DIR`` or
            ``~/.cache/est``); ``False`` disables caching.
        transform: optional callable applied to each sample.
    """

    TARGET_NAMES = TARGET_NAMES
    TARGET_UNITS = TARGET_UNITS

    def __init__(
        self,
        root: Optional[Union[str, os.PathLike]] = None,
        *,
        source: str = "auto",
        split: Optional[str] = None,
        subset: Optional[Union[int, float]] = None,
        seed: int = 0,
        split_sizes: Tuple[int, int] = STANDARD_SPLIT,
        atomref: str = "b3lyp",
        uncharacterized: Optional[Union[str, os.PathLike]] = None,
        cache_dir: Optional[Union[str, os.PathLike, bool]] = None,
        transform=None,
        verbose: bool = True,
    ):
        if split not in (None, "all", "train", "val", "test"):
            raise ValueError(f"split must be 'train', 'val', 'test' or None, got {split!r}")
        if atomref not in ("b3lyp", "fit"):
            raise ValueError(f"atomref must be 'b3lyp' or 'fit', got {atomref!r}")
        self.root = None if root is None else os.path.abspath(os.fspath(root))
        self.source, self.source_path, self._files = self._detect(self.root, source)
        self.transform = transform
        self.verbose = verbose
        self.seed = seed
        self.split = split or "all"
        self.atomref_mode = atomref
        self._unc_path = None if uncharacterized is None else os.fspath(uncharacterized)
        self._log(f"QM9: using source '{self.source}' at {self.source_path}")

        arrays, self.cache_path = self._load(cache_dir)
        self._check_complete(arrays["index"])
        self._index = arrays["index"].astype(np.int64)  # gdb index per molecule
        self._natoms_all = arrays["natoms"].astype(np.int64)
        self._offsets = np.concatenate([[0], np.cumsum(self._natoms_all)]).astype(np.int64)
        self._z = arrays["z"].astype(np.int64)
        self._pos = arrays["pos"].astype(np.float32)
        self._y = arrays["y"].astype(np.float64)  # [M, 19]
        n = len(self._index)
        self.splits = qm9_split(n, seed, split_sizes)
        if subset is not None:
            self.splits = {k: v[: _subset_count(len(v), subset, n)] for k, v in self.splits.items()}
        if self.split == "all":
            sel = np.sort(np.concatenate(list(self.splits.values()))) if subset is not None else np.arange(n)
        else:
            sel = self.splits[self.split]
        self.indices = np.asarray(sel, dtype=np.int64)
        self._atomref_cache: Dict[str, np.ndarray] = {}

    # ------------------------------------------------------------------ sources
    @staticmethod
    def _detect(root: Optional[str], source: str) -> Tuple[str, str, List[str]]:
        if source not in ("auto", "qm9pack", "pyg", "xyz"):
            raise ValueError(f"source must be 'auto', 'qm9pack', 'pyg' or 'xyz', got {source!r}")
        looked = []
        if root is not None and not os.path.exists(root):
            raise FileNotFoundError(f"QM9 root {root} does not exist")
        candidates: List[Tuple[str, str, List[str]]] = []
        if root is not None:
            if os.path.isfile(root):
                if root.endswith((".tar.bz2", ".tar", ".tar.gz", ".tgz", ".tbz2")):
                    candidates.append(("xyz", root, [root]))
                elif root.endswith(".csv"):
                    candidates.append(("qm9pack", root, [root]))
            else:
                for folder in (root, os.path.join(root, "raw")):
                    if os.path.isfile(os.path.join(folder, "gdb9.sdf")) and os.path.isfile(os.path.join(folder, "gdb9.sdf.csv")):
                        files = [os.path.join(folder, "gdb9.sdf"), os.path.join(folder, "gdb9.sdf.csv")]
                        candidates.append(("pyg", folder, files))
                        break
                for folder in (root, os.path.join(root, "raw")):
                    tars = sorted(glob.glob(os.path.join(folder, "dsgdb9nsd.xyz.tar*")))
                    if tars:
                        candidates.append(("xyz", tars[0], tars[:1]))
                        break
                xyzs = sorted(glob.glob(os.path.join(root, "*.xyz")))
                if xyzs:
                    candidates.append(("xyz", root, xyzs))
                parts = sorted(glob.glob(os.path.join(root, "qm9_part*.csv")))
                if parts:
                    candidates.append(("qm9pack", root, parts))
            looked.append(f"{root} (gdb9.sdf + gdb9.sdf.csv, dsgdb9nsd.xyz.tar.bz2, *.xyz, qm9_part*.csv)")
        else:
            d = qm9pack_data_dir()
            if d is not None:
                candidates.append(("qm9pack", d, sorted(glob.glob(os.path.join(d, "qm9_part*.csv")))))
            looked.append("the installed qm9pack package (not installed)" if d is None else d)
        for kind, path, files in candidates:
            if source in ("auto", kind):
                return kind, path, files
        hint = " Install the offline copy with `pip install qm9pack` (or `pip install est[qm9]`)." if root is None else ""
        raise FileNotFoundError(
            f"no QM9 source{'' if source == 'auto' else ' of kind ' + repr(source)} found; looked in: "
            + "; ".join(looked) + "." + hint
        )

    def _exclusion(self) -> Tuple[Set[int], str]:
        if self._unc_path is not None:
            return read_uncharacterized(self._unc_path), os.path.abspath(self._unc_path)
        if self.source in ("pyg", "xyz"):
            folder = self.source_path if os.path.isdir(self.source_path) else os.path.dirname(self.source_path)
            own = os.path.join(folder, "uncharacterized.txt")
            if os.path.isfile(own):
                listed = read_uncharacterized(own)
                if len(listed) > 1000 and listed != shipped_uncharacterized():
                    warnings.warn(
                        f"{own} lists {len(listed)} molecules; QM9's published list has 3,054 "
                        f"({len(listed ^ shipped_uncharacterized())} indices differ). Using the file as given."
                    )
                return listed, own
        if self.source == "qm9pack":
            # qm9pack already leaves out the uncharacterised molecules
            return set(), "qm9pack (already excluded)"
        return shipped_uncharacterized(), "est/data/assets/qm9_uncharacterized.txt"

    def _records(self, exclude: Set[int]) -> Iterable[Record]:
        if self.source == "qm9pack":
            return read_qm9pack_csv(self._files)
        if self.source == "pyg":
            return read_pyg_raw(self.source_path, exclude=exclude)
        if os.path.isdir(self.source_path):
            return read_xyz_folder(self.source_path, exclude=exclude)
        return read_xyz_tar(self.source_path, exclude=exclude)

    def _process(self, exclude: Set[int]) -> Dict[str, np.ndarray]:
        t0 = time.time()
        index, natoms, zs, poss, ys = [], [], [], [], []
        for rec in self._records(exclude):
            if rec.index in exclude:
                continue
            index.append(rec.index)
            natoms.append(len(rec.z))
            zs.append(rec.z)
            poss.append(rec.pos)
            ys.append(rec.pyg_targets if rec.pyg_targets is not None else to_pyg_targets(rec.native, rec.z))
        if not index:
            raise ValueError(f"QM9 source {self.source_path} contains no molecules")
        order = np.argsort(np.asarray(index), kind="stable")
        index_arr = np.asarray(index, dtype=np.int64)[order]
        if len(np.unique(index_arr)) != len(index_arr):
            raise ValueError(f"QM9 source {self.source_path} lists some molecule index twice")
        arrays = {
            "index": index_arr,
            "natoms": np.asarray(natoms, dtype=np.int64)[order],
            "z": np.concatenate([zs[i] for i in order]).astype(np.int8),
            "pos": np.concatenate([poss[i] for i in order]).astype(np.float32),
            "y": np.stack([ys[i] for i in order]).astype(np.float64),
        }
        self._log(f"QM9: processed {len(index_arr)} molecules from '{self.source}' in {time.time() - t0:.1f} s")
        return arrays

    def _load(self, cache_dir) -> Tuple[Dict[str, np.ndarray], Optional[str]]:
        exclude, exclusion_source = self._exclusion()
        payload = {
            "version": _PROCESS_VERSION,
            "source": self.source,
            "files": [file_signature(f) for f in self._files],
            "exclude": sorted(exclude),
            "exclusion_source": exclusion_source,
        }
        path = None
        if cache_dir is not False:
            folder = os.path.join(default_cache_dir(cache_dir if cache_dir is not True else None), "qm9")
            # a folder source (PyG raw folder, extracted xyz folder) is never written into;
            # a single archive file cannot be written into anyway
            src_folder = self.source_path if os.path.isdir(self.source_path) else None
            if self.source != "qm9pack" and src_folder is not None and is_inside(folder, src_folder):
                raise ValueError(
                    f"cache folder {folder} is inside the QM9 source folder {src_folder}; est never writes into a "
                    "source folder: pass another cache_dir (or set EST_CACHE_DIR)"
                )
            path = os.path.join(folder, f"{self.source}-{cache_key(payload)}.npz")
            if os.path.isfile(path):
                try:
                    with np.load(path, allow_pickle=False) as z:
                        arrays = {k: z[k] for k in ("index", "natoms", "z", "pos", "y")}
                    self._log(f"QM9: loaded processed cache {path}")
                    return arrays, path
                except Exception as exc:  # corrupt cache: rebuild
                    warnings.warn(f"QM9: ignoring unreadable cache {path} ({exc}); reprocessing")
        arrays = self._process(exclude)
        if path is not None:
            try:
                atomic_savez(path, **arrays)
                self._log(f"QM9: wrote processed cache {path}")
            except OSError as exc:
                warnings.warn(f"QM9: cannot write the cache {path} ({exc}); continuing without one "
                              "(set cache_dir or EST_CACHE_DIR to a writable folder)")
                path = None
        return arrays, path

    def _check_complete(self, index: np.ndarray) -> None:
        """Warn (or, for the installed qm9pack, raise) when the source looks like a cut or partial copy.

        See :func:`~est.data.qm9_formats.qm9_gaps`: a part (qm9pack file, or the
        whole release for the PyG / xyz sources) whose molecules are the first
        ones of its index range but fewer than it holds was cut; a part with
        none, next to such copies, is missing. A hand-made selection passes.
        """
        parts = QM9PACK_PARTS if self.source == "qm9pack" else QM9_RELEASE_PART
        gaps = qm9_gaps(index, self._files, parts)
        if not gaps:
            return
        msg = (f"QM9 source {self.source_path} ({self.source}): {len(index):,} molecules loaded, QM9 has {QM9_SIZE:,} "
               f"(without the 3,054 uncharacterised); " + "; ".join(gaps) + ".")
        if self.source == "qm9pack" and self.root is None:
            raise ValueError(msg + " The installed qm9pack is damaged. Fix: pip install --force-reinstall --no-deps qm9pack")
        warnings.warn(msg + " Fix: copy the source again; to train on part of QM9 on purpose, load all of it "
                      "and pass subset=N.", stacklevel=3)

    def _log(self, msg: str) -> None:
        if self.verbose:
            print(msg, file=sys.stderr)

    # ------------------------------------------------------------------ public
    def __len__(self) -> int:
        return len(self.indices)

    @property
    def natoms(self) -> np.ndarray:
        """Atom counts of this dataset's molecules (for balanced batching)."""
        return self._natoms_all[self.indices]

    @property
    def gdb_index(self) -> np.ndarray:
        """QM9 (gdb) index of each of this dataset's molecules."""
        return self._index[self.indices]

    @property
    def targets(self) -> torch.Tensor:
        """All targets of this dataset, float64 [M, 19]."""
        return torch.from_numpy(self._y[self.indices])

    def composition(self, rows: Optional[np.ndarray] = None) -> np.ndarray:
        """Element counts [M, 5] (H, C, N, O, F) of the given global rows (default: this dataset's)."""
        rows = self.indices if rows is None else rows
        mol = np.repeat(np.arange(len(self._natoms_all)), self._natoms_all)
        counts = np.zeros((len(self._natoms_all), 5), dtype=np.float64)
        lookup = np.full(10, -1)
        lookup[list(_ELEMENTS)] = np.arange(5)
        np.add.at(counts, (mol, lookup[self._z]), 1.0)
        return counts[rows]

    def atomref(self, target: int = 7, mode: Optional[str] = None) -> Optional[torch.Tensor]:
        """Per-element reference energies [100] in eV for target 7-10 (U0, U, H, G); None otherwise.

        ``mode="b3lyp"``: QM9's free-atom B3LYP energies x 27.211386246 (PyG's
        values). ``mode="fit"``: least squares ``E ~ sum_e n_e w_e`` (no
        intercept) over the full training split, float64.
        """
        mode = mode or self.atomref_mode
        if target not in (7, 8, 9, 10):
            return None
        out = np.zeros(100, dtype=np.float64)
        if mode == "b3lyp":
            for z, refs in B3LYP_ATOM_ENERGIES.items():
                out[z] = refs[target - 7] * HAR2EV
        elif mode == "fit":
            key = f"fit{target}"
            if key not in self._atomref_cache:
                rows = qm9_split(len(self._index), self.seed)["train"]
                A = self.composition(rows)
                w, *_ = np.linalg.lstsq(A, self._y[rows, target], rcond=None)
                self._atomref_cache[key] = w
            out[list(_ELEMENTS)] = self._atomref_cache[key]
        else:
            raise ValueError(f"mode must be 'b3lyp' or 'fit', got {mode!r}")
        return torch.from_numpy(out)

    def __getitem__(self, i: int):
        i = int(i)
        if i < 0:
            i += len(self.indices)
        row = int(self.indices[i])
        a, b = int(self._offsets[row]), int(self._offsets[row + 1])
        sample = make_sample(
            pos=torch.from_numpy(self._pos[a:b].copy()),
            atomic_numbers=torch.from_numpy(self._z[a:b].copy()),
            y=torch.from_numpy(self._y[row : row + 1].astype(np.float32)),
            sid=int(self._index[row]),
            fid=0,
            idx=int(i),
            where=f"QM9 {self.source_path} gdb {int(self._index[row])}",
        )
        return self.transform(sample) if self.transform is not None else sample

    def __repr__(self) -> str:
        n = len(self.indices) if hasattr(self, "indices") else "?"
        return f"QM9(source={getattr(self, 'source', '?')!r}, split={getattr(self, 'split', '?')!r}, molecules={n})"
