"""Which device a run uses, found without initialising CUDA in this process.

vLLM starts its engine and worker processes by forking unless CUDA is already initialised
(`torch.cuda.is_initialized()`); a CUDA driver initialised in the parent before that fork fails in the
children (vLLM issue #32611). `torch.cuda.is_available()` initialises the driver (cudaGetDeviceCount ->
cuInit) unless PYTORCH_NVML_BASED_CUDA_CHECK=1, and it does so without setting is_initialized(), so vLLM
cannot see it. `torch.cuda.device_count()` counts through NVML before torch has initialised CUDA. Every
device check of spcli goes through this module, and the CLI turns on torch's NVML check for the
libraries it calls (`nvml_device_checks`), so nothing touches the CUDA runtime before vLLM has forked.
"""

from __future__ import annotations

import gc
import os

import torch

NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"


def nvml_device_checks() -> None:
    """Make torch.cuda.is_available() count through NVML in this process (and its children) unless the
    user chose otherwise: transformers and others call it while spcli loads tokenizers and configs."""
    os.environ.setdefault(NVML_CHECK, "1")


def cuda_device_count() -> int:
    """GPUs visible to this process, through NVML (the CUDA runtime only where NVML cannot answer)."""
    return torch.cuda.device_count()


def pick_device(device: str) -> torch.device:
    """'auto' -> the first GPU where there is one, else the CPU; any other name as it is."""
    if device == "auto":
        return torch.device("cuda" if cuda_device_count() > 0 else "cpu")
    return torch.device(device)


def free_memory(release_cache: bool = True) -> None:
    """After an out-of-memory error: the failed tensors are garbage once the exception is gone; with
    `release_cache`, return the allocator's cached blocks to CUDA where this process uses it (never initialising
    it to do so).

    Not in a vLLM worker (issue 40): there the cache holds vLLM's own step workspace beside the speculator's
    freed blocks; `empty_cache` would hand vLLM's back (its next step must allocate them again, maybe after the
    speculator took them) and wait for the device while vLLM runs. The retry one prompt at a time reuses the
    cached blocks as they are."""
    gc.collect()
    if release_cache and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def synchronize(device: torch.device) -> None:
    """Wait for the work this thread queued on `device` (CUDA kernels run ahead of the host), so that a host clock
    read next times it; nothing to wait for on the CPU. Only the thread's current stream: in a vLLM worker the
    speculator runs on a stream of its own (replica_queue.py) and must not wait for vLLM's steps on the others,
    as `torch.cuda.synchronize` (the whole device) would (issue 40)."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
