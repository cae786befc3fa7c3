"""spcli/engines/vllm/worker/pinned_upload.py on CPU: one contiguous run per call, buffers used in turn, a buffer written
again only after the event of the copy that last read it was waited on. (On CPU no memory is pinned and
no CUDA event exists: `pin=False` and an event that records what was asked of it.)"""

from __future__ import annotations

import numpy as np
import torch

from spcli.engines.vllm.worker.pinned_upload import NUM_BUFFERS, PinnedUpload


class Event:
    """Stands in for torch.cuda.Event: logs record() and synchronize() in one shared journal."""

    def __init__(self, journal: list, number: int):
        self.journal, self.number = journal, number

    def record(self):
        self.journal.append(("record", self.number))

    def synchronize(self):
        self.journal.append(("wait", self.number))


def uploader():
    journal: list = []
    count = iter(range(1000))
    return PinnedUpload(torch.device("cpu"), pin=False, new_event=lambda: Event(journal, next(count))), journal


def test_values_arrive_and_runs_are_contiguous():
    up, _ = uploader()
    for n in (5, 63, 1, 200):  # growing and shrinking
        slots, values = np.arange(n, dtype=np.int64) * 3, np.arange(n, dtype=np.int64) + 1000
        s, v = up(slots, values)
        assert s.tolist() == slots.tolist() and v.tolist() == values.tolist()
        assert s.is_contiguous() and v.is_contiguous() and s.numel() == n


def test_a_buffer_is_rewritten_only_after_its_last_copy_is_waited_on():
    up, journal = uploader()
    arrays = (np.arange(7, dtype=np.int64), np.arange(7, dtype=np.int64))
    for _ in range(NUM_BUFFERS):
        up(*arrays)
    assert journal == [("record", i) for i in range(NUM_BUFFERS)]  # fresh buffers: nothing to wait on
    first = up.buffers[0]
    first_ptr = first.data_ptr()
    up(*arrays)  # buffer 0 again: waits on event 0 (its copy), before writing
    assert journal[NUM_BUFFERS:] == [("wait", 0), ("record", NUM_BUFFERS)]
    assert up.buffers[0].data_ptr() == first_ptr  # reused, not reallocated
    assert len({id(b) for b in up.buffers}) == NUM_BUFFERS  # distinct buffers: step k+1 never writes step k's


def test_results_survive_the_next_calls():
    """The device tensors a call returned are not changed by the next calls' writes (its own copy)."""
    up, _ = uploader()
    kept = [up(np.full(4, k, dtype=np.int64), np.full(4, -k, dtype=np.int64)) for k in range(5)]
    for k, (s, v) in enumerate(kept):
        assert s.tolist() == [k] * 4 and v.tolist() == [-k] * 4
