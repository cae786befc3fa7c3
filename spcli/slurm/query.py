"""What Slurm says about the tasks of an array job: `squeue` for what slurmctld still holds, `sacct`
for what accounting recorded. Both are optional; `query` returns None when neither answers.

squeue --states=all keeps an ended task for MinJobAge (300 s by default) and is the live truth (a
requeued task reads PENDING there while sacct may still show the attempt that ended); sacct fills
in the tasks squeue has forgotten, and the exit codes squeue does not report.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

# Slurm job states by what they mean for a task.
ACTIVE = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SIGNALING", "STAGE_OUT", "RESIZING"})
WAITING = frozenset({"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "SUSPENDED", "STOPPED",
                     "RESV_DEL_HOLD", "SPECIAL_EXIT"})
ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL",
                   "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "REVOKED"})

_TASK = re.compile(r"^(\d+)_(\d+)$")  # 123_4
_RANGE = re.compile(r"^(\d+)_\[([\d,\-%]+)\]$")  # 123_[0-5%2]: sacct's unsplit pending tasks


@dataclass(frozen=True)
class TaskState:
    state: str  # Slurm's word: RUNNING, PENDING, COMPLETED, FAILED, CANCELLED, PREEMPTED...
    reason: str | None = None  # squeue's reason for a waiting task: BeginTime, Priority, Resources...
    exit_code: int | None = None  # sacct's ExitCode "2:0" -> 2 (the batch script's exit)
    source: str = "squeue"  # squeue | sacct


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _expand(spec: str) -> list[int]:
    """"0-5%2" / "1,3-4" -> the task ids ("%K", the limit on tasks running at once, is dropped)."""
    ids: list[int] = []
    for part in spec.split("%")[0].split(","):
        low, _, high = part.partition("-")
        ids += range(int(low), int(high or low) + 1)
    return ids


def _tasks(job_field: str, job_id: str) -> list[int | None]:
    if job_field == job_id:  # not an array job
        return [None]
    if (m := _TASK.match(job_field)) and m.group(1) == job_id:
        return [int(m.group(2))]
    if (m := _RANGE.match(job_field)) and m.group(1) == job_id:
        return list(_expand(m.group(2)))
    return []  # another job, or a step


def parse_squeue(text: str, job_id: str) -> dict[int | None, TaskState]:
    """`squeue --noheader --array --format=%i|%T|%r` lines -> state per task."""
    states: dict[int | None, TaskState] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 3:
            continue
        job, state, reason = fields
        for task in _tasks(job, job_id):
            states[task] = TaskState(state, None if reason in ("None", "") else reason, None, "squeue")
    return states


def parse_sacct(text: str, job_id: str) -> dict[int | None, TaskState]:
    """`sacct --noheader --parsable2 --allocations --format=JobID,State,ExitCode` -> state per task."""
    states: dict[int | None, TaskState] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 3:
            continue
        job, state, exit_code = fields
        code = exit_code.split(":")[0]
        for task in _tasks(job, job_id):
            # "CANCELLED by 0" -> CANCELLED
            states[task] = TaskState(state.split()[0] if state else "UNKNOWN", None,
                                     int(code) if code.isdigit() else None, "sacct")
    return states


def query(job_id: str, timeout: float = 15) -> dict[int | None, TaskState] | None:
    """Each task's state (key None for a job that is not an array), or None where neither squeue nor
    sacct could be asked (no Slurm commands here, slurmctld down, no accounting and job purged...)."""
    squeue = _run(["squeue", "--noheader", "--array", "--states=all", f"--jobs={job_id}",
                   "--format=%i|%T|%r"], timeout)
    sacct = _run(["sacct", "--noheader", "--parsable2", "--allocations", f"--jobs={job_id}",
                  "--format=JobID,State,ExitCode"], timeout)
    queued = parse_squeue(squeue.stdout, job_id) if squeue is not None and squeue.returncode == 0 else None
    if squeue is not None and squeue.returncode != 0 and "Invalid job id" in squeue.stderr:
        queued = {}  # slurmctld answered: it no longer holds the job
    recorded = parse_sacct(sacct.stdout, job_id) if sacct is not None and sacct.returncode == 0 else None
    if queued is None and recorded is None:
        return None
    states = dict(recorded or {})
    for task, state in (queued or {}).items():
        ended = recorded.get(task) if recorded else None
        if state.state in ENDED and ended is not None and ended.state == state.state:
            state = TaskState(state.state, state.reason, ended.exit_code, "squeue")
        states[task] = state
    return states
