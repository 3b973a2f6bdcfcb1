"""SIGTERM/SIGINT during training: the first one is recorded (stop after this step), a second one stops now.

>>> stop = StopSignals(rank=0)
>>> with stop.installed():
...     ...  # the loop checks ``stop.signum`` (all-reduced, so every rank stops together)

The handlers are installed only in the main thread (Python allows no other)
and the previous ones are restored on exit.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Iterator, Optional

__all__ = ["StopSignals"]


class StopSignals:
    """Records the first SIGTERM/SIGINT in ``signum``; a second one raises ``KeyboardInterrupt``."""

    def __init__(self, *, rank: int = 0):
        self.rank = rank
        self.signum: Optional[int] = None

    def _handler(self, signum, frame) -> None:
        if self.signum is not None:  # second signal: stop now
            raise KeyboardInterrupt
        self.signum = signum
        print(f"[est.train] rank {self.rank}: received {signal.Signals(signum).name}; "
              "saving a checkpoint after this step, then exiting", file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
        for s in old:
            signal.signal(s, self._handler)
        try:
            yield
        finally:
            for s, h in old.items():
                signal.signal(s, h)
