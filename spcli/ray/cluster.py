"""The Ray cluster of a run: connecting to it, and the resources each actor asks for.

`--ray` alone: `ray.init()` (the cluster RAY_ADDRESS names, else a new local one on this machine);
`--ray auto`: the cluster running on this machine (`ray start --head`); `--ray host:port` or
`--ray ray://host:port`: that cluster (GCS address, or Ray Client).

Each actor gets a placement group of one bundle, so its GPUs are on one node (vLLM's tensor parallelism
runs inside the actor, over the node's NVLink): `tp` GPUs for --engine vllm, one for hf on a GPU, and CPUs
alone where the run is on the CPU (--device cpu, or a cluster without GPUs).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from spcli.config.run import RunConfig
from spcli.errors import ConfigError

log = logging.getLogger("spcli")

CPUS_PER_CPU_WORKER = 4  # default actors on a CPU cluster: one per this many CPUs (torch threads each)


def require_ray():
    try:
        import ray
    except ImportError:
        raise ConfigError("--ray needs Ray: pip install 'specprefill-cli[ray]'") from None
    return ray


def connect(address: str) -> bool:
    """Join (or start) the cluster; True if this call started the connection (and should end it)."""
    ray = require_ray()
    if ray.is_initialized():  # a caller (a notebook, the tests) already holds one: use it
        return False
    if address and Path(address).exists():
        raise ConfigError(f"--ray took {address!r} as the cluster's address, but it is a file: give the inputs "
                          "before --ray, or --ray=ADDRESS")
    try:
        ray.init(address=address or None, log_to_driver=True, logging_level=logging.WARNING)
    except (ConnectionError, ValueError, RuntimeError) as e:
        raise ConfigError(f"--ray {address or '(local)'}: cannot connect to a Ray cluster ({e})") from None
    return True


@dataclass(frozen=True)
class ActorShape:
    num_workers: int
    bundle: dict[str, float]  # one actor's placement-group bundle: {"CPU": c, "GPU": g}


def actor_shape(cfg: RunConfig, resources: dict) -> ActorShape:
    """How many actors, each with what, from the cluster's resources (ray.cluster_resources())."""
    from spcli.models.lookup import PRESETS

    gpus, cpus = int(resources.get("GPU", 0)), max(1, int(resources.get("CPU", 1)))
    preset = PRESETS.get(cfg.model)
    on_cpu = cfg.device == "cpu" or gpus == 0 or (cfg.device == "auto" and preset is not None and preset.is_cpu_model)
    if on_cpu:
        n = cfg.ray_workers or max(1, cpus // CPUS_PER_CPU_WORKER)
        return ActorShape(n, {"CPU": max(1, cpus // n)})
    per = (cfg.vllm.tp or (preset.tp if preset else 1)) if cfg.engine == "vllm" else 1
    n = cfg.ray_workers or max(1, gpus // per)
    if n * per > gpus:
        log.warning("--ray-workers %d x %d GPU(s) is more than the cluster's %d GPUs now: the actors that do not fit "
                    "wait until GPUs join", n, per, gpus)
    return ActorShape(n, {"GPU": per, "CPU": 1})
