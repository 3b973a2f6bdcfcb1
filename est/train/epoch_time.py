"""Time per epoch, measured at the start of training on the device in use.

The first ``warmup`` optimiser steps of a process are not timed (allocator,
autotuning, first-touch of the data files); the next ``steps`` are, by wall
clock from the end of the last warm-up step to the end of the last timed one,
data loading included and evaluation time excluded. Then

    epoch time ~= steps_per_epoch x (timed wall time / timed steps),

printed once as an estimate that names its sample (``N steps after W
warm-up``), the device and, on CPU, the threads. A run shorter than
``warmup + steps`` estimates from the timed steps it has, if any.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

import torch

__all__ = ["EpochTimer", "device_label", "format_duration"]


def device_label(device: torch.device) -> str:
    """``"cpu (8 threads)"`` or ``"cuda:0 (NVIDIA H200)"``."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return f"{device} ({torch.get_num_threads()} threads)"


def format_duration(seconds: float) -> str:
    """``"42 s"``, ``"7.5 min"`` or ``"3 h 12 min"``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    hours = int(seconds // 3600)
    return f"{hours} h {round((seconds - 3600 * hours) / 60):d} min"


class EpochTimer:
    """Times a few training steps after warm-up and returns the per-epoch estimate once (module docstring).

    Call :meth:`step_done` after every optimiser step with the seconds spent in
    evaluation so far (excluded from the timing); it returns the message when
    the last timed step is done, else None. :meth:`finish` returns the message of
    a run that ended early (or None). ``steps=0`` disables the estimate.
    """

    def __init__(self, *, steps_per_epoch: int, device: torch.device, warmup: int = 2, steps: int = 5,
                 clock: Callable[[], float] = time.perf_counter):
        if warmup < 1 or steps < 0:
            raise ValueError(f"EpochTimer needs warmup >= 1 (the first step carries one-off costs) and steps >= 0, "
                             f"got warmup={warmup}, steps={steps}")
        self.steps_per_epoch = int(steps_per_epoch)
        self.device = device
        self.warmup, self.steps = int(warmup), int(steps)
        self.clock = clock
        self.done = 0                 # steps finished in this process
        self.t0: Optional[float] = None
        self.eval0 = 0.0
        self.seconds_per_step: Optional[float] = None
        self.reported = steps == 0

    def step_done(self, eval_seconds: float = 0.0) -> Optional[str]:
        if self.reported:
            return None
        self.done += 1
        if self.done == self.warmup:
            self._sync()
            self.t0, self.eval0 = self.clock(), eval_seconds
        if self.done == self.warmup + self.steps:
            return self._report(self.steps, eval_seconds)
        return None

    def finish(self, eval_seconds: float = 0.0) -> Optional[str]:
        timed = self.done - self.warmup
        if self.reported or timed < 1 or self.t0 is None:
            return None
        return self._report(timed, eval_seconds)

    def _sync(self) -> None:
        """Wait for queued GPU work, so the clock reads finished steps."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _report(self, timed: int, eval_seconds: float) -> str:
        self.reported = True
        self._sync()
        wall = self.clock() - self.t0 - (eval_seconds - self.eval0)
        self.seconds_per_step = wall / timed
        epoch = self.seconds_per_step * self.steps_per_epoch
        return (f"[est.train] time per epoch ~ {format_duration(epoch)} on {device_label(self.device)}: "
                f"{self.steps_per_epoch:,} steps x {self.seconds_per_step:.3g} s/step, estimated from {timed} "
                f"step(s) after {self.warmup} warm-up step(s) (data loading included, evaluation excluded)")
