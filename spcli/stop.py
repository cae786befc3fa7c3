"""Graceful stop on SIGTERM, SIGINT and SIGUSR1 (Slurm's warning before a time limit or preemption).

The first signal asks the run to stop after the batch in flight is committed; a second SIGINT
(Ctrl-C twice) stops at once. Either way nothing half-written is ever committed.
"""

from __future__ import annotations

import signal
import threading

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


class StopRequest:
    def __init__(self, log=lambda msg: None):
        self.signal_name: str | None = None
        self.log = log
        self._previous: dict = {}

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.signal_name is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # second Ctrl-C: leave now; the manifest is only ever replaced atomically
        if self.signal_name is None:
            self.signal_name = name
            self.log(f"{name} received: finishing the batch in flight, then committing and exiting (resumable)")

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous.clear()
