"""cpu_memory: a freed activation's pages are reused, not faulted in again (a fresh process per probe: mallopt lasts)."""

import json
import os
import subprocess
import sys

from spcli.models.cpu_memory import MALLOC_ENV

PROBE = """
import ctypes, json, resource, sys
from spcli.models.cpu_memory import keep_freed_memory
import os
from spcli.engines.vllm.driver.args import cpu_env_defaults  # noqa: E402 (no vLLM import: the engine's own env)
if sys.argv[1] == "apply-after-env":  # the vLLM engine's driver: its processes' env set here first (issue 58)
    for key, value in cpu_env_defaults(1).items():
        os.environ.setdefault(key, value)
applied = keep_freed_memory() if sys.argv[1].startswith("apply") else None
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes, libc.memset.argtypes = [ctypes.c_void_p], [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
def activation():  # 64 MiB written and freed: one activation of a prefill at ~1.5k tokens x 4 prompts
    p = libc.malloc(64 << 20)
    libc.memset(p, 1, 64 << 20)
    libc.free(p)
activation()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    activation()
print(json.dumps({"applied": applied, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def probe(mode: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in MALLOC_ENV}
    out = subprocess.run([sys.executable, "-c", PROBE, mode], env={**clean, **env}, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.splitlines()[-1])


def test_freed_memory_is_reused_in_this_process_and_in_started_ones():
    default = probe("none")
    assert default["faults"] > 4 * 10_000  # glibc: each 64 MiB tensor mmapped afresh, 16k pages each
    applied = probe("apply")
    assert applied["applied"] is True and applied["faults"] < default["faults"] / 20
    by_env = probe("none", **MALLOC_ENV)  # what vLLM's processes get (vllm_args.cpu_env_defaults)
    assert by_env["faults"] < default["faults"] / 20


def test_a_users_malloc_setting_stands():
    theirs = probe("apply", MALLOC_MMAP_MAX_="65536")
    assert theirs["applied"] is False and theirs["faults"] > 4 * 10_000


def test_the_vllm_engines_driver_keeps_freed_memory_after_setting_vllms_env():
    """spcli puts MALLOC_ENV in os.environ for vLLM's processes before the driver's speculator loads: this process
    (started without them) still gets the settings through mallopt."""
    driver = probe("apply-after-env")
    assert driver["applied"] is True and driver["faults"] < probe("none")["faults"] / 20
