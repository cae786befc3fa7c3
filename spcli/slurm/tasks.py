"""Slurm array tasks: which task this process is, and which shards it owns."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ArrayTask:
    index: int
    count: int
    job_id: str
    restart_count: int


def array_task(env: Mapping[str, str] | None = None) -> ArrayTask | None:
    env = os.environ if env is None else env
    if "SLURM_ARRAY_TASK_ID" not in env:
        return None
    index = int(env["SLURM_ARRAY_TASK_ID"])
    if "SLURM_ARRAY_TASK_COUNT" in env:
        count = int(env["SLURM_ARRAY_TASK_COUNT"])
    else:
        count = int(env.get("SLURM_ARRAY_TASK_MAX", index)) - int(env.get("SLURM_ARRAY_TASK_MIN", 0)) + 1
    return ArrayTask(index, count, env.get("SLURM_ARRAY_JOB_ID", env.get("SLURM_JOB_ID", "")),
                     int(env.get("SLURM_RESTART_COUNT", 0)))


def assign_shards(shards: Sequence[str], index: int, count: int) -> list[int]:
    """Round robin: shard i belongs to task i % count."""
    return [i for i in range(len(shards)) if i % count == index]
