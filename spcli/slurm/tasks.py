"""Slurm array tasks: which task this process is, and which input shards it owns.

Pure functions over an environment mapping and a shard list; nothing here talks to Slurm.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from spcli.errors import ConfigError

# Exported by the script `render_sbatch` writes: the size of the array as submitted, so a task
# resubmitted alone (`sbatch --array=3,7 ...`) still takes its share of the whole array.
COUNT_OVERRIDE = "SPCLI_ARRAY_TASK_COUNT"


@dataclass(frozen=True)
class ArrayTask:
    """One task of a Slurm job array."""

    index: int  # SLURM_ARRAY_TASK_ID, in [0, count)
    count: int  # tasks in the array
    job_id: str  # SLURM_ARRAY_JOB_ID: the same for every task of the array
    restart_count: int  # SLURM_RESTART_COUNT: times this task was requeued (0 on the first run)


def _int(env: Mapping[str, str], name: str) -> int:
    value = env[name]
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"${name} must be an integer, got {value!r}") from None


def array_task(env: Mapping[str, str] | None = None) -> ArrayTask | None:
    """This process's array task, or None outside a Slurm job array.

    The count is SLURM_ARRAY_TASK_COUNT, or SLURM_ARRAY_TASK_MAX - SLURM_ARRAY_TASK_MIN + 1 where
    the count is not set (older Slurm); $SPCLI_ARRAY_TASK_COUNT overrides both. Slurm leaves
    SLURM_RESTART_COUNT unset until a task is first requeued, so a missing one reads as 0.
    """
    env = os.environ if env is None else env
    if "SLURM_ARRAY_TASK_ID" not in env:
        return None
    index = _int(env, "SLURM_ARRAY_TASK_ID")
    if COUNT_OVERRIDE in env:
        count = _int(env, COUNT_OVERRIDE)
    elif "SLURM_ARRAY_TASK_COUNT" in env:
        count = _int(env, "SLURM_ARRAY_TASK_COUNT")
    elif "SLURM_ARRAY_TASK_MIN" in env and "SLURM_ARRAY_TASK_MAX" in env:
        count = _int(env, "SLURM_ARRAY_TASK_MAX") - _int(env, "SLURM_ARRAY_TASK_MIN") + 1
    else:
        raise ConfigError("$SLURM_ARRAY_TASK_ID is set but neither $SLURM_ARRAY_TASK_COUNT nor "
                          "$SLURM_ARRAY_TASK_MIN/$SLURM_ARRAY_TASK_MAX are")
    if not 0 <= index < count:
        raise ConfigError(f"array task {index} is outside 0-{count - 1}: submit spcli arrays as "
                          f"--array=0-<N-1> (or set ${COUNT_OVERRIDE} to the array's full size)")
    job_id = env.get("SLURM_ARRAY_JOB_ID") or env.get("SLURM_JOB_ID", "")
    restart_count = _int(env, "SLURM_RESTART_COUNT") if env.get("SLURM_RESTART_COUNT") else 0
    return ArrayTask(index=index, count=count, job_id=job_id, restart_count=restart_count)


def assign_shards(shards: Sequence[str], index: int, count: int) -> list[int]:
    """Positions in `shards` that task `index` of `count` owns, in order.

    Round robin by position: shard i goes to task i % count. The caller passes the shards
    sorted, so every task computes the same split on its own, and a requeued or resubmitted
    task gets exactly the shards it had before. Every shard goes to exactly one task; with more
    tasks than shards the extra tasks get none.
    """
    if count < 1:
        raise ConfigError(f"array task count must be >= 1, got {count}")
    if not 0 <= index < count:
        raise ConfigError(f"array task index must be in 0-{count - 1}, got {index}")
    return list(range(index, len(shards), count))
