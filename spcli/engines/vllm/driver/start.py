"""vLLM started on a thread of its own, so that this process reads, tokenizes and scores while vLLM starts.

`LLM(...)` blocks its caller for as long as vLLM takes to start: its engine and worker processes import vLLM,
load the weights and size the KV cache (~30-40 s for the 1.5B model on this machine's 2 CPUs, minutes for a
large model on GPUs), and the caller waits on a socket all that time. Where the speculator is in this process
on the CPU (`--speculator-placement driver`, auto's pick on a CPU), the job loop scores its first windows
meanwhile (spcli.job.batch.stream_rows) and submits them once vLLM is up.

There the speculator and vLLM share the same cores, and two sets of OpenMP threads on them slow both (each waits
at its barriers for a thread the other set holds): the speculator took 2.2-2.8x its hf engine time beside vLLM
(issue 58). So the start runs `nice` lower (`nice`, per thread on Linux): the processes it spawns, vLLM's engine
core and workers, inherit it, and run on what this process's speculator leaves; whenever it does not run, they
have the cores as before.

    starting = StartingRunner(make)    # make() -> a VllmRunner, called on a thread
    starting.done()                    # started, or failed to, without waiting
    starting.wait(timeout)             # the same, waiting up to `timeout` seconds
    starting.result()                  # the runner (waits); the start's exception is raised here
    StartingRunner.of(runner)          # one already started
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import Any


class StartingRunner:
    def __init__(self, make: Callable[[], Any] | None, runner=None, nice: int = 0):
        """`nice`: how much lower the start thread, and so every process and thread it starts, runs than this one."""
        self._done = threading.Event()
        self._runner: Any = runner
        self._error: BaseException | None = None
        if make is None:
            self._done.set()
            return
        threading.Thread(target=self._start, args=(make, nice), name="spcli-vllm-start", daemon=True).start()

    @classmethod
    def of(cls, runner) -> StartingRunner:
        return cls(None, runner)

    def _start(self, make: Callable[[], Any], nice: int) -> None:
        try:
            if nice:
                _lower_this_thread(nice)
            self._runner = make()
        except BaseException as e:  # noqa: BLE001 (raised to whoever asks for the runner)
            self._error = e
        finally:
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the start has ended (started or failed) within `timeout` seconds."""
        return self._done.wait(timeout)

    def result(self):
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._runner

    def started(self):
        """The runner where it started; None while it starts or where its start failed (no wait)."""
        return self._runner if self.done() else None


def _lower_this_thread(nice: int) -> None:
    """This thread `nice` levels lower (Linux keeps a nice value per thread; the processes and threads it starts
    inherit it). Elsewhere (macOS: a thread id is no process id for setpriority) vLLM keeps this process's priority."""
    if not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError:
        pass
