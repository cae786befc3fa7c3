"""Graceful stop on SIGTERM, SIGINT and SIGUSR1 (Slurm's warning before a time limit or preemption).

SIGTERM and SIGUSR1 (Slurm gives a lead time) let the batch in flight finish and be committed. The
first SIGINT (Ctrl-C, a person waiting) stops the batch in flight at its next safe point: between
the speculator's prompt groups, before the base pass, or between decode steps; that batch's rows
are dropped and redone on resume. A second SIGINT stops at once. Either way only whole rows are
ever committed.
"""

from __future__ import annotations

import signal
import threading

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


def stop_message(name: str) -> str:
    if name == "SIGINT":
        return ("SIGINT received: stopping the batch in flight at its next safe point (its rows are redone on resume), "
                "committing the finished rows and exiting (resumable); press Ctrl-C again to stop at once")
    return f"{name} received: finishing the batch in flight, then committing and exiting (resumable)"


class StopRequest:
    def __init__(self, log=lambda msg: None):
        self.signal_name: str | None = None
        self.log = log
        self._previous: dict = {}

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def is_urgent(self) -> bool:
        """A person pressed Ctrl-C: the batch in flight stops at its next safe point."""
        return self.signal_name == "SIGINT"

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.signal_name is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # second Ctrl-C: leave now; the manifest is only ever replaced atomically
        if self.signal_name is None:
            self.signal_name = name
            self.log(stop_message(name))

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous.clear()
