"""Host arrays to the device without a sync: the kept-position remap's upload (vllm_worker.py).

A non-blocking host-to-device copy is asynchronous only from pinned memory, and only as one contiguous
run: a strided view of a pinned buffer (the rows of `pinned[:, :n]`) is staged by PyTorch through pageable
memory, which waits for the GPU (vLLM's own runner notes the same for `mrope_positions`). So each call
packs its arrays back to back into one 1-D pinned buffer and copies that contiguous run in one
non-blocking copy.

Reuse is guarded by events, not by an assumed sync: with async scheduling vLLM prepares step k+1 on the
host while step k runs on the GPU, so no step boundary promises that an earlier copy has read its
buffer. NUM_BUFFERS buffers are used in turn; after each copy an event is recorded on the current
stream, and before a buffer is written again the host waits on that buffer's event, i.e. exactly until
the copy that last read it has finished (long past, in practice: NUM_BUFFERS steps earlier).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

NUM_BUFFERS = 2


def cuda_event():
    return torch.cuda.Event()


class PinnedUpload:
    """`upload(a, b, ...)`: 1-D int64 host arrays of equal length T' -> device tensors [T'] each."""

    def __init__(self, device: torch.device, pin: bool = True, new_event: Callable = cuda_event):
        self.device = device
        self.pin = pin  # False only where no accelerator exists (CPU tests of this logic)
        self.new_event = new_event
        self.buffers: list[torch.Tensor | None] = [None] * NUM_BUFFERS  # each [capacity] int64, pinned
        self.events: list = [None] * NUM_BUFFERS  # recorded after the copy that last read that buffer
        self.turn = 0

    def __call__(self, *arrays: np.ndarray) -> list[torch.Tensor]:
        n = arrays[0].size
        assert all(a.size == n and a.ndim == 1 for a in arrays), "equal-length 1-D arrays"
        i, self.turn = self.turn, (self.turn + 1) % NUM_BUFFERS
        if self.events[i] is not None:
            self.events[i].synchronize()  # the copy that last read buffer i is done: it may be written
        buffer = self.buffers[i]
        if buffer is None or buffer.numel() < len(arrays) * n:
            buffer = torch.empty(max(len(arrays) * n, 2 * (0 if buffer is None else buffer.numel())),
                                 dtype=torch.int64, pin_memory=self.pin)
            self.buffers[i] = buffer
        for k, a in enumerate(arrays):
            buffer[k * n : (k + 1) * n] = torch.from_numpy(a)
        run = buffer[: len(arrays) * n]  # contiguous: one DMA from pinned memory
        assert run.is_contiguous()
        on_device = run.to(self.device, non_blocking=True, copy=True)  # [len(arrays) * T']
        event = self.new_event()
        event.record()
        self.events[i] = event
        return list(on_device.split(n))
