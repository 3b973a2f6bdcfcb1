"""Checkpoints: atomic writes, ``weights_only=True`` loads, RNG state capture.

A checkpoint is a dict of tensors and plain python values only (so
``torch.load(..., weights_only=True)`` reads it; nothing in it can run code):
``model``, ``optimizer``, ``scheduler``, ``ema``, ``normalizers``, ``rng``
(one entry per rank), ``sampler``, ``step``, ``epoch``, ``best``, ``config``
(the full resolved config), ``elements`` (atomic numbers seen in training,
with ``elements_source``), ``model_defaults`` (the version of the model
presets' defaults the config was resolved under,
``est.models.config.MODEL_DEFAULTS_VERSION``; absent: 1) and ``format``.
Writes go to a temporary file in the same folder, are flushed and fsynced,
then renamed over the target (``os.replace``), so a crash never leaves a
half-written ``last.pt``.
"""
from __future__ import annotations

import os
import random
import shutil
import tempfile
from typing import Any, Dict

import numpy as np
import torch

__all__ = ["save_checkpoint", "load_checkpoint", "copy_checkpoint", "checkpoint_step", "resolve_checkpoint_path",
           "rng_state", "set_rng_state", "FORMAT_VERSION"]

FORMAT_VERSION = 1


def _atomic_write(path: str, write) -> None:
    """``write(file)`` into a temporary file next to ``path``, fsync, rename over ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_checkpoint(state: Dict[str, Any], path: str) -> None:
    _atomic_write(path, lambda f: torch.save(state, f))


def copy_checkpoint(src: str, dst: str) -> None:
    """Copy ``src`` to ``dst`` atomically (a kill leaves the old ``dst`` or the new one)."""
    def write(f):
        with open(src, "rb") as g:
            shutil.copyfileobj(g, f, length=16 << 20)

    _atomic_write(dst, write)


def checkpoint_step(path: str) -> Any:
    """The ``step`` of a checkpoint without reading its tensors (memory-mapped), or None if unreadable."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True).get("step")
    except Exception:
        return None


def resolve_checkpoint_path(path: str) -> str:
    """A checkpoint file: ``path`` itself, or for a run folder its ``best.pt`` (else ``last.pt``).

    Raises ``FileNotFoundError`` naming what the folder holds and the fix.
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"checkpoint {path} does not exist. Fix: give an existing .pt file or a run_dir.")
        return path
    for name in ("best.pt", "last.pt"):
        if os.path.isfile(os.path.join(path, name)):
            return os.path.join(path, name)
    found = sorted(f for f in os.listdir(path) if f.endswith(".pt"))
    raise FileNotFoundError(f"{path} is a folder without best.pt or last.pt (.pt files there: {found or 'none'}). "
                            "Fix: pass a checkpoint file, or the run_dir of a training run.")


def load_checkpoint(path: str, map_location: Any = "cpu") -> Dict[str, Any]:
    if os.path.isdir(path):
        raise IsADirectoryError(f"checkpoint {path} is a folder, not a file. Fix: pass {os.path.join(path, 'best.pt')} "
                                "(or last.pt) of that run.")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:
        raise RuntimeError(f"cannot load checkpoint {path} with weights_only=True ({type(exc).__name__}: {exc}). "
                           "It is corrupt or was not written by est.train.") from None


def rng_state() -> Dict[str, Any]:
    """torch (CPU and CUDA), numpy and python RNG states as tensors / plain types."""
    np_state = np.random.get_state()
    py = random.getstate()
    out = {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "gauss": float(np_state[4])},
        "python": {"version": int(py[0]), "state": list(py[1]), "gauss": py[2]},
    }
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
