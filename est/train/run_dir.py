"""A run's folder: can it be written, what a run resumes from, is it finished, is ``best.pt`` behind.

Files of a run (``run_dir``): ``last.pt`` (every evaluation, every
``save_every`` steps, on SIGTERM/SIGINT, at the end), ``best.pt`` (when the
monitored metric improves), ``metrics.csv``, ``tb/``, the final plots, and
``final_metrics.json``, written last and atomically: a run is *finished* only
when it names the run's final step.

Everything here touches files only and runs on one process; the trainer makes
the collective decisions (main rank reads, every rank gets the answer).
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Dict, List, Optional, Tuple

from .checkpoint import checkpoint_step, copy_checkpoint, load_checkpoint
from .config import ConfigError

__all__ = ["check_run_dir", "write_json_atomic", "resume_checkpoint", "check_same_model", "final_results_written",
           "repair_best"]


def check_run_dir(path: str) -> Optional[str]:
    """Create ``path`` and prove it writable; the problem and its fix as a message, or None if fine."""
    if os.path.exists(path) and not os.path.isdir(path):
        return (f"run_dir={path} is a file, not a folder. Fix: choose another run_dir (e.g. run_dir={path}_run) "
                "or move the file away.")
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".est_write_test.", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return (f"run_dir={path} cannot be created or written ({type(exc).__name__}: {exc.strerror or exc}). "
                "Fix: choose a run_dir on a writable disk, e.g. run_dir=$HOME/runs/NAME.")
    return None


def write_json_atomic(obj: Any, path: str) -> None:
    """``obj`` as JSON at ``path``: written to a temporary file, fsynced, renamed over ``path``."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def resume_checkpoint(run_dir: str, resume: str) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """``(checkpoint, its path)`` a run resumes from, or ``(None, None)`` for a fresh start.

    ``resume``: ``"auto"`` (``run_dir/last.pt`` if it exists), ``"never"``, or
    the path of a checkpoint.
    """
    last = os.path.join(run_dir, "last.pt")
    if resume == "auto" and os.path.isfile(last):
        return load_checkpoint(last), last
    if resume not in ("auto", "never"):
        return load_checkpoint(resume), resume
    return None, None


def check_same_model(saved: Dict[str, Any], now: Dict[str, Any], path: Optional[str]) -> None:
    """Refuse to resume checkpoint ``path`` (model config ``saved``) under another model config ``now``.

    Keys set to ``"auto"`` in ``now`` take the saved value and never differ.
    """
    diff: List[str] = sorted(k for k in set(now) | set(saved) if now.get(k) != saved.get(k) and now.get(k) != "auto")
    if diff:
        hint = ""
        was, is_ = dict(saved.get("est") or {}), dict(now.get("est") or {})
        def rest(est: Dict[str, Any]) -> Dict[str, Any]:  # the EST options other than the logit cap
            return {k: v for k, v in est.items() if k != "logit_cap"}

        if diff == ["est"] and was.get("logit_cap") == 0 and is_.get("logit_cap") is None and rest(was) == rest(is_):
            hint = (" It was trained before model defaults v2 with unbounded attention logits; "
                    "add model.est.logit_cap=0 to resume it as it was trained, or")
        raise ConfigError(f"{path} was trained with a different model config ({', '.join('model.' + k for k in diff)}). "
                          f"Fix:{hint} use a new run_dir, or trainer.resume=never to start over in this one.")


def final_results_written(run_dir: str, step: int) -> bool:
    """Whether ``run_dir/final_metrics.json`` exists and names ``step``."""
    try:
        with open(os.path.join(run_dir, "final_metrics.json")) as f:
            return json.load(f).get("step") == step
    except (OSError, ValueError):
        return False


def repair_best(run_dir: str, step: int) -> Optional[str]:
    """Copy ``last.pt`` over ``best.pt`` if ``best.pt`` is not at ``step``; what was done, or None.

    Called when ``last.pt`` records an improving evaluation at its own step:
    ``last.pt`` is written before ``best.pt`` then, so a kill in between leaves
    ``best.pt`` one evaluation behind, while both would hold the same state.
    """
    last, best = os.path.join(run_dir, "last.pt"), os.path.join(run_dir, "best.pt")
    if checkpoint_step(best) == step:
        return None
    copy_checkpoint(last, best)
    return f"{best} was behind the evaluation at step {step} (interrupted write): restored from {last}"
