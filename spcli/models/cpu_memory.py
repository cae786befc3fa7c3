"""On the CPU, freed memory kept for the next forward pass instead of handed back to the kernel (glibc malloc).

glibc serves every allocation above its mmap threshold (at most 32 MiB) with a fresh `mmap` and returns it
with `munmap` when freed. A prefill's activations are larger than that at ordinary lengths (Qwen2.5-0.5B's
MLP at 4 prompts x 1.5k tokens: 60 MiB per tensor), so every layer of every pass faults its activations in
again as new zeroed pages: ~590k page faults and 3.8 s of system time per 4-prompt speculator pass inside a
vLLM CPU worker, where that pass took 5.1 s; with the settings below 2.5 s (docs/results/cpu-malloc.md).
The settings: no allocation through mmap, and the heap's free top kept up to 2 GiB, so a freed block is
reused by the next allocation of its size. The heap then stays at the run's peak, which a batch job
reaches in its first window anyway.

Two ways in, the same two settings: `MALLOC_ENV` for processes not started yet (vLLM's engine and worker
processes read it at their start: `vllm_args.cpu_env_defaults`), `keep_freed_memory()` for this process
(the hf engine, eval, bench and calibrate load their models into it, and the vLLM engine its driver speculator).
Nothing happens on a C library other than glibc, nor where the process started with either variable set.
"""

from __future__ import annotations

import ctypes
import os

TRIM_THRESHOLD = 2**31 - 1  # bytes of free heap top kept (mallopt takes an int): beyond a forward pass's peak
MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD)}
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # mallopt parameters (malloc.h)
_done: bool | None = None


def set_at_start() -> bool:
    """Whether this process started with one of MALLOC_ENV's variables set (what glibc read then): its initial
    environment (/proc/self/environ), not os.environ, where spcli itself puts them for vLLM's processes
    (cpu_env_defaults) before this process's speculator loads: read there, the driver's speculator ran without
    them, every pass faulting its activations in afresh (issue 58). os.environ where /proc is not there."""
    try:
        with open("/proc/self/environ", "rb") as f:
            names = {entry.partition(b"=")[0] for entry in f.read().split(b"\0")}
    except OSError:
        return any(key in os.environ for key in MALLOC_ENV)
    return any(key.encode() in names for key in MALLOC_ENV)


def keep_freed_memory() -> bool:
    """Apply MALLOC_ENV to this running process through glibc's mallopt, once; False where the C library has
    no mallopt or the user set one of the variables (theirs stands)."""
    global _done
    if _done is None:
        _done = False
        if not set_at_start():
            try:
                mallopt = ctypes.CDLL(None).mallopt
            except (OSError, AttributeError):
                return False
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            _done = bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _done
