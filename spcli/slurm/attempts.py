"""The log of a Slurm array task's attempts: one line per attempt, written by the sbatch script."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from spcli.errors import SpcliError


@dataclass(frozen=True)
class Attempt:
    """One line of <out>/slurm/attempts-<task>.log, written when an attempt ends:
    `time=<UTC ISO> task=<i> restart=<n> exit=<code> action=<action> job=<array>_<i> host=<node>`.

    action: done (exit 0) | requeue (exit 75, requeued itself) | requeue-failed (a second line
    after requeue: scontrol requeue failed) | gave-up (exit 75, restart >= max_requeues) |
    stopped (exit 75 with the job no longer RUNNING: scancel, the time limit, or the end of a
    preemption's GraceTime, after which Slurm requeues it itself) | failed (any other code).
    """

    time: str
    task: int
    restart: int
    exit: int
    action: str
    job: str
    host: str


def read_attempts(out_dir) -> dict[int, list[Attempt]]:
    """Every task's attempts, oldest first, from <out>/slurm/attempts-*.log."""
    attempts: dict[int, list[Attempt]] = {}
    for path in sorted((Path(out_dir) / "slurm").glob("attempts-*.log")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                f = dict(item.split("=", 1) for item in line.split())
                attempt = Attempt(f["time"], int(f["task"]), int(f["restart"]), int(f["exit"]),
                                  f["action"], f["job"], f["host"])
            except (KeyError, ValueError):
                raise SpcliError(f"{path}:{number}: not an attempt line: {line!r}") from None
            attempts.setdefault(attempt.task, []).append(attempt)
    return attempts
