"""Command line: ``python train.py [+experiment=NAME] [key=value ...]`` (Hydra override syntax).

Also ``--cfg`` (print the resolved config and exit) and ``-h/--help``.
``mode=eval`` evaluates a checkpoint (``ckpt=...`` or ``run_dir/best.pt``)
on ``eval_splits`` and writes metrics and predictions.
Works the same under ``torchrun --nproc_per_node K train.py ...``.
Exit codes: 0 done, 2 configuration error, 3 non-finite loss, 143/130
interrupted by SIGTERM/SIGINT after saving ``last.pt``.
"""
from __future__ import annotations

import os
import signal
import sys
from typing import List, Optional, Sequence

from omegaconf import OmegaConf

from .config import ConfigError, load_config

__all__ = ["main"]

USAGE = __doc__ + """
Experiments (configs/experiment): qm9, qm9_eqv2, qm9_quick, oc20_s2ef, oc20_s2ef_quick, oc20_is2re, oc20_is2re_quick
Common overrides: trainer.max_epochs=N trainer.max_steps=N data.subset=N run_dir=DIR
                  data.train_path=... data.val_path=... model=est_tiny model.lmax=4
"""


def main(argv: Optional[Sequence[str]] = None, *, config_dir: Optional[str] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    show = "--cfg" in argv
    overrides: List[str] = [a for a in argv if a != "--cfg"]
    try:
        cfg = load_config(overrides, config_dir=config_dir)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    if show:
        print(OmegaConf.to_yaml(cfg))
        return 0
    from .distributed import setup_distributed
    from .eval_mode import evaluate_checkpoint
    from .nonfinite import NonFiniteLossError
    from .trainer import Trainer

    try:
        info = setup_distributed(cfg.trainer.device)
        if cfg.mode == "eval":
            evaluate_checkpoint(cfg, overrides, info=info)
            return 0
        trainer = Trainer(cfg, info=info)
        status = trainer.fit()
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    except NonFiniteLossError as exc:
        print(f"training stopped: {exc}", file=sys.stderr)
        return 3
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    if status == "interrupted":
        sig = trainer._stop_signal or signal.SIGTERM
        return 128 + int(sig)
    return 0
