"""Submit now, collect later: a speculator replica's jobs on a thread of their own (issue 33 item 2).

In a vLLM worker, `spcli_speculate` runs on the worker's main thread, so vLLM's own steps wait while a
window is scored. With a queue, the worker's RPC only submits (`submit(job_id, fn, *args)` returns at
once) and a second call collects (`collect(job_id)`), so the driver can hand vLLM its steps while window
k + 1 is scored. On CUDA the thread scores on a stream of its own (`torch.cuda.Stream(device)`), so its
kernels overlap vLLM's on the same GPU; results are host bytes, published only after that stream has
synchronized. On CPU there are no spare cores for the overlap: spcli leaves it off there (the protocol is
the same and is tested on CPU).

Protocol: jobs run one at a time in submission order; collect may ask for any submitted job, in any order,
and blocks until it is done; a job's exception is raised by its collect; each result is collected once.
close() finishes the running job, fails the ones still queued (their collect raises QueueClosed) and
joins the thread; submit after close raises QueueClosed.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from contextlib import nullcontext

import torch

_STOP = object()


class QueueClosed(RuntimeError):
    """The queue was closed before this job ran, or a job was submitted after close()."""


class SpeculatorQueue:
    def __init__(self, device: torch.device | None = None):
        self.device = device
        self._jobs: queue.Queue = queue.Queue()
        self._done: dict[str, tuple[bool, object]] = {}  # job id -> (ok, result or exception)
        self._known: set[str] = set()  # submitted, not yet collected
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="spcli-speculator", daemon=True)
        self._thread.start()

    def submit(self, job_id: str, fn: Callable, *args) -> None:
        with self._cond:
            if self._closed:
                raise QueueClosed(f"speculator queue closed: job {job_id!r} not accepted")
            assert job_id not in self._known, f"job {job_id!r} submitted twice"
            self._known.add(job_id)
        self._jobs.put((job_id, fn, args))

    def collect(self, job_id: str, timeout: float | None = None):
        """The job's result (its exception raised here); blocks until it is done."""
        with self._cond:
            if job_id not in self._known:
                raise KeyError(f"no job {job_id!r} submitted (or it was collected already)")
            if not self._cond.wait_for(lambda: job_id in self._done, timeout):
                raise TimeoutError(f"speculator job {job_id!r} not done after {timeout} s")
            self._known.discard(job_id)
            ok, value = self._done.pop(job_id)
        if not ok:
            raise value  # type: ignore[misc]
        return value

    def is_done(self, job_id: str) -> bool:
        """Whether a submitted job has finished (its collect returns at once)."""
        with self._cond:
            if job_id not in self._known:
                raise KeyError(f"no job {job_id!r} submitted (or it was collected already)")
            return job_id in self._done

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
        self._jobs.put(_STOP)
        self._thread.join()

    def _loop(self) -> None:
        stream = torch.cuda.Stream(self.device) if self.device is not None and self.device.type == "cuda" else None
        while True:
            item = self._jobs.get()
            if item is _STOP:
                break
            job_id, fn, args = item
            with self._cond:
                closed = self._closed
            if closed:
                self._finish(job_id, False, QueueClosed(f"speculator queue closed before job {job_id!r} ran"))
                continue
            try:
                with torch.cuda.stream(stream) if stream is not None else nullcontext():
                    value = fn(*args)
                if stream is not None:
                    stream.synchronize()  # the result's tensors are written before anyone reads them
                self._finish(job_id, True, value)
            except BaseException as e:  # noqa: BLE001 (handed to the collector)
                self._finish(job_id, False, e)
        while True:  # jobs queued behind the stop: fail them, so no collector waits for ever
            try:
                item = self._jobs.get_nowait()
            except queue.Empty:
                return
            if item is not _STOP:
                self._finish(item[0], False, QueueClosed(f"speculator queue closed before job {item[0]!r} ran"))

    def _finish(self, job_id: str, ok: bool, value) -> None:
        with self._cond:
            self._done[job_id] = (ok, value)
            self._cond.notify_all()


def overlaps(setting: str, is_cpu: bool, has_workers: bool) -> bool:
    """Whether the job loop submits windows and collects them later (--speculator-overlap): `on` where the
    speculator is in vLLM's workers; `auto` there too, except on CPU, whose cores vLLM already uses."""
    if not has_workers or setting == "off":
        return False
    return setting == "on" or not is_cpu
