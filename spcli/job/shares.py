"""Which shards this process owns: all of them, its Slurm array task's, or a pool worker's (a Ray actor)."""

from __future__ import annotations

from dataclasses import dataclass, field

from spcli.errors import OutputError
from spcli.io.shards import Shard


@dataclass
class WorkerShare:
    """What one worker of a pool runs (a Ray actor: spcli/ray/worker.py), as a Slurm array task runs its share.

    task: its manifest's task record (`manifest-task-<index>.json`, its own lock); shards: the shards (or row
    ranges of them: spcli/ray/pieces.py) it owns in that manifest (those it committed to before and the one it
    takes now); the fingerprint's inputs are every file of the job, the same for every worker, so that a
    worker's list of shards can grow. engines: the worker's engines kept between shards (a model loads once per
    worker)."""

    task: dict
    shards: tuple[Shard, ...]
    engines: dict = field(default_factory=dict)


def my_shards(shards: list[Shard], share: WorkerShare | None = None) -> tuple[list[Shard], dict | None]:
    """The shards this process owns: all of them, its share inside a Slurm array task, or a pool worker's."""
    from spcli.slurm.tasks import array_task, assign_shards

    if share is not None:
        missing = {s.path for s in share.shards} - {s.path for s in shards}
        if missing:
            raise OutputError(f"{sorted(missing)[0]}: a shard this worker owns is no longer among the inputs")
        return list(share.shards), share.task
    task = array_task()
    if task is None:
        return shards, None
    mine = assign_shards([s.path for s in shards], task.index, task.count)
    return [shards[i] for i in mine], {"index": task.index, "count": task.count, "job_id": task.job_id,
                                       "restart_count": task.restart_count}
