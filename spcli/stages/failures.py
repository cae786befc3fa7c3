"""How an engine tells a failure it can retry (out of memory) from one that ends the run (a device error)."""

from __future__ import annotations

import torch

from spcli.errors import EngineDied

OUT_OF_MEMORY = ("out of memory", "can't allocate memory", "cannot allocate memory")
DEVICE_ERRORS = ("cuda error", "device-side assert", "illegal memory access", "nccl", "cublas_status",
                 "cudnn_status", "hip error", "xpu error")


def is_out_of_memory(e: BaseException) -> bool:
    """A GPU out-of-memory, or a CPU allocation failure (MemoryError, DefaultCPUAllocator)."""
    return isinstance(e, (torch.OutOfMemoryError, MemoryError)) or any(s in str(e).lower() for s in OUT_OF_MEMORY)


def is_device_error(e: BaseException) -> bool:
    """A device error that is not out of memory: the device (or its communicator) cannot go on."""
    return not is_out_of_memory(e) and any(s in str(e).lower() for s in DEVICE_ERRORS)


def raise_if_device_error(e: BaseException, engine: str) -> None:
    """Turn a device error into EngineDied (the run stops after committing what is complete)."""
    if is_device_error(e):
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise EngineDied(f"the {engine} engine hit a device error ({first}); committed rows are safe: "
                         "fix the device and run the same command again to resume") from e
