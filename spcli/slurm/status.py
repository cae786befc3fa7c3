"""`spcli status DIR`: progress of an output directory per array task and overall, and an exit code.

What is done comes from the manifests alone (a shard is done when a manifest says so). The rest
is read where it exists: <out>/slurm/submissions.jsonl (job id, array size, each task's shards,
written by `spcli slurm submit`), the attempts logs (exit and action of each ended attempt,
written by the sbatch script), the task logs <out>/slurm/logs/<job>_<task>.out (error messages),
and squeue/sacct (what Slurm says now). Without Slurm the state comes from the directory alone.

Each task gets a phase, and the run the worst of them:
  done     every shard of the task committed (rows with an `error` count as done)
  running  Slurm runs it (or, from the directory: a live process holds its lock; a killed one's is stale)
  waiting  pending, requeued, or not started yet
  unknown  stopped or interrupted, and nothing says whether it runs again
  failed   ended without finishing its shards and will not run again by itself
Exit codes: 0 every task done; 3 not done yet (running, waiting, unknown); 4 a task failed
(even while others still run: the run cannot finish without a resubmission).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from spcli.errors import OutputError
from spcli.io.lock import is_held
from spcli.io.manifest import config_history, history_lines, progress_key, read_manifests
from spcli.slurm import query
from spcli.slurm.attempts import Attempt, read_attempts
from spcli.slurm.submit import read_submissions

EXIT_DONE, EXIT_NOT_DONE, EXIT_FAILED = 0, 3, 4
PHASE_ORDER = ("failed", "running", "waiting", "unknown", "done")  # the run's phase: the first present
# spcli's own error line, or slurmstepd's "*** JOB 5 ON n1 CANCELLED AT ... ***" (time limit, preemption...).
_ERROR_LINE = re.compile(r"^(spcli: (?:error|internal error): |slurmstepd(?:-\S+)?: error: \*\*\* )")
_ATTEMPT_HEADER = "spcli-slurm: task "
_ENDED_WHY = {"CANCELLED": "cancelled", "TIMEOUT": "time limit reached", "NODE_FAIL": "node failure",
              "OUT_OF_MEMORY": "out of memory", "PREEMPTED": "preempted and not requeued",
              "BOOT_FAIL": "node boot failure", "DEADLINE": "deadline passed"}


@dataclass
class TaskStatus:
    index: int | None  # array task; None for a run outside a Slurm array (manifest.json)
    phase: str  # done | running | waiting | unknown | failed
    state: str  # Slurm's state when it answered, else from the directory (DONE, REQUEUED, ...)
    shards: int | None  # None: not known yet (no submission record, task not started)
    shards_done: int
    rows: int  # committed rows
    rows_total: int | None  # None until every shard of the task has been counted
    failed_rows: int  # committed rows with an error
    requeues: int
    exit_code: int | None  # of the last ended attempt
    message: str | None


@dataclass
class RunStatus:
    out: str
    job_id: str | None
    slurm: bool  # squeue/sacct answered
    tasks: list[TaskStatus]
    configs: list[dict] = field(default_factory=list)  # config_history: every configuration that made parts

    @property
    def phase(self) -> str:
        phases = {t.phase for t in self.tasks}
        return next(p for p in PHASE_ORDER if p in phases)

    @property
    def exit_code(self) -> int:
        return {"done": EXIT_DONE, "failed": EXIT_FAILED}.get(self.phase, EXIT_NOT_DONE)

    def totals(self) -> dict:
        t = self.tasks
        known = all(x.shards is not None for x in t)
        return {"shards": sum(x.shards for x in t) if known else None, "shards_done": sum(x.shards_done for x in t),
                "rows": sum(x.rows for x in t), "failed_rows": sum(x.failed_rows for x in t),
                "rows_total": sum(x.rows_total for x in t) if all(x.rows_total is not None for x in t) else None,
                "requeues": sum(x.requeues for x in t)}

    def to_dict(self) -> dict:
        return {"out": self.out, "job_id": self.job_id, "slurm": self.slurm, "phase": self.phase,
                "exit_code": self.exit_code, **self.totals(), "tasks": [asdict(t) for t in self.tasks],
                "configs": self.configs}


def collect(out, ask_slurm: bool = True) -> RunStatus:
    out = Path(out).absolute()
    if not out.is_dir():
        raise OutputError(f"{out}: no such directory")
    docs = read_manifests(out)
    submissions = read_submissions(out)
    sub = submissions[-1] if submissions else None
    by_task = {d["task"]["index"]: d for d in docs if d.get("task")}
    job_id = sub.job_id if sub else _latest_job(docs)
    attempts = {i: [a for a in found if job_id is None or a.job.split("_")[0] == job_id]
                for i, found in read_attempts(out).items()}
    count = sub.tasks if sub else max((d["task"]["count"] for d in by_task.values()), default=0)
    indexes: list[int | None] = sorted(set(range(count)) | set(by_task) | set(attempts))
    plain = [d for d in docs if not d.get("task")]
    if plain:
        indexes.insert(0, None)
        by_task[None] = plain[0]
    if not indexes:
        raise OutputError(f"{out}: no spcli run or Slurm submission here (no manifest*.json, no slurm/ records)")
    states = query.query(job_id) if ask_slurm and job_id and (sub or by_task.keys() - {None}) else None
    progress = _best_progress(docs)
    tasks = []
    for i in indexes:
        doc = by_task.get(i)
        own = sub.task_shards(i) if sub and i is not None else _own_shards(doc) if doc else None
        state = None if states is None or i is None else states.get(i)
        tasks.append(_task(out, job_id, i, own, progress, doc, attempts.get(i, []), state))
    tasks += _ray_not_started(docs)
    return RunStatus(str(out), job_id, states is not None, tasks, config_history(docs))


def _own_shards(doc: dict) -> list[str]:
    """The shards a manifest's run was given (its fingerprint's inputs; else every shard it lists). A Ray actor
    slot's are those it lists: its fingerprint names every input of the job (spcli/ray/slots.py)."""
    if (doc.get("task") or {}).get("ray"):
        return [progress_key(p) for p in doc["shards"].values()]
    inputs = (doc.get("fingerprint_fields") or {}).get("inputs")
    return [s["path"] for s in inputs] if inputs is not None else [p["path"] for p in doc["shards"].values()]


def _ray_not_started(docs: list[dict]) -> list[TaskStatus]:
    """`spcli run --ray`: what no actor slot has started yet (spcli.ray.pieces.not_started) as one waiting row
    (task `-`): so a job whose slots are all done but whose driver stopped before handing out its last ranges
    is not done."""
    from spcli.ray.pieces import not_started

    left = not_started(docs)
    if not left:
        return []
    files, gaps = sum(s.rows is None for s in left), sum(s.rows is not None for s in left)
    what = ", ".join(part for part in (files and f"{files} file(s)", gaps and f"{gaps} row range(s) of files cut "
                                       "in ranges") if part)
    return [TaskStatus(index=None, phase="waiting", state="NOT_STARTED", shards=len(left), shards_done=0, rows=0,
                       rows_total=None, failed_rows=0, requeues=0, exit_code=None,
                       message=f"no Ray actor has started {what}: run the same spcli run --ray command to go on")]


def _latest_job(docs: list[dict]) -> str | None:
    """The Slurm job of the newest task manifest; a Ray actor slot's job_id is the Ray run's, not Slurm's."""
    with_job = [d for d in docs if d.get("task") and d["task"].get("job_id") and not d["task"].get("ray")]
    return max(with_job, key=lambda d: d.get("updated", 0))["task"]["job_id"] if with_job else None


def _best_progress(docs: list[dict]) -> dict[str, dict]:
    """Each shard's (or row range's: `progress_key`) most advanced progress over all manifests."""
    best: dict[str, dict] = {}
    for doc in docs:
        for p in doc["shards"].values():
            old = best.get(progress_key(p))
            if old is None or (p["done"], p["next_row"]) > (old["done"], old["next_row"]):
                best[progress_key(p)] = p
    return best


def _requeues(attempts: list[Attempt], doc: dict | None, job_id: str | None) -> int:
    seen = [a.restart for a in attempts]
    if attempts and attempts[-1].action == "requeue":
        seen.append(attempts[-1].restart + 1)  # requeued itself; the next attempt has not ended yet
    task = (doc or {}).get("task") or {}
    if job_id is None or task.get("job_id") == job_id:
        seen.append(task.get("restart_count") or 0)
    return max(seen, default=0)


def _task(out: Path, job_id, index, own, progress, doc, attempts, state) -> TaskStatus:
    shard_progress = [progress.get(p) for p in own or ()]
    got = [p for p in shard_progress if p is not None]
    totals = [p.get("total_rows") for p in got]
    is_done = own is not None and all(p is not None and p["done"] for p in shard_progress)
    last = attempts[-1] if attempts else None
    phase, word, message = _judge(out, job_id, index, own, is_done, shard_progress, doc, last, state)
    return TaskStatus(
        index=index, phase=phase, state=word, shards=None if own is None else len(own),
        shards_done=sum(p["done"] for p in got), rows=sum(p["rows"] for p in got),
        rows_total=sum(totals) if own is not None and len(got) == len(own) and None not in totals else None,
        failed_rows=sum(p["failed"] for p in got), requeues=_requeues(attempts, doc, job_id),
        exit_code=last.exit if last else (state.exit_code if state else None), message=message)


def _judge(out, job_id, index, own, is_done, shard_progress, doc, last: Attempt | None, state):
    """(phase, state word, message) of one task."""
    if is_done:
        return "done", state.state if state else "DONE", None
    lock = out / (".lock" if index is None else f".lock-task-{index:05d}")
    if state is not None:
        if state.state in query.ACTIVE:
            return "running", state.state, None
        if state.state in query.WAITING:
            return "waiting", state.state, state.reason and f"reason: {state.reason}"
        if state.state == "COMPLETED":
            left = sum(not (p and p["done"]) for p in shard_progress)
            return "failed", state.state, f"ended with exit 0 but {left} of {len(own or ())} shard(s) are not done"
        if state.state in query.ENDED:
            return "failed", state.state, _why(out, job_id, index, last, state)
        return "unknown", state.state, None
    if last is not None and last.action in ("requeue", "stopped") and is_held(lock):
        return "running", "RUNNING", "from its lock file: a later attempt holds it"
    if last is not None:
        if last.action == "requeue":
            return "waiting", "REQUEUED", "requeued itself after exit 75; it restarts when Slurm schedules it"
        if last.action == "stopped":
            return "unknown", "STOPPED", ("stopped by Slurm after committing (cancelled, time limit or preemption; "
                                          "Slurm requeues preempted tasks itself)")
        return "failed", "GAVE_UP" if last.action == "gave-up" else "FAILED", _why(out, job_id, index, last, None)
    if doc is not None:
        if is_held(lock):
            return "running", "RUNNING", "from its lock file"
        return "unknown", "INTERRUPTED", "started, not finished and not running: run it again to resume"
    return "waiting", "NOT_STARTED", None


def _why(out: Path, job_id, index, last: Attempt | None, state) -> str:
    code = last.exit if last else (state.exit_code if state else None)
    if last is not None and last.action == "gave-up":
        return (f"interrupted (exit 75) at restart {last.restart}, the --max-requeues limit; "
                "resubmit the same command to continue")
    logged = _log_error(out, job_id, index)
    reason = _ENDED_WHY.get(state.state) if state is not None else None
    show_code = code is not None and code != 0 and reason is None  # "cancelled" says more than its exit
    parts = [f"exit {code}" if show_code else None, reason, logged]
    return ": ".join(p for p in parts if p) or "ended without finishing its shards"


def _log_error(out: Path, job_id, index) -> str | None:
    """The last error line of the task's last attempt in <out>/slurm/logs/<job>_<task>.out."""
    if job_id is None or index is None:
        return None
    path = out / "slurm" / "logs" / f"{job_id}_{index}.out"  # spcli.slurm.script: --output=%A_%a.out
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - (256 << 10)))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    starts = [i for i, line in enumerate(lines) if line.startswith(_ATTEMPT_HEADER) and " attempt " in line]
    errors = [line for line in lines[starts[-1] if starts else 0:] if _ERROR_LINE.match(line)]
    spcli_errors = [line for line in errors if line.startswith("spcli: ")]
    chosen = spcli_errors[-1] if spcli_errors else errors[0] if errors else None  # *** JOB ... *** before *** STEP
    if chosen is None:
        return None
    return re.sub(r"^slurmstepd(?:-\S+)?: error: ", "", chosen.removeprefix("spcli: error: ").removeprefix("spcli: "))


def render(status: RunStatus) -> str:
    """The status as a table: one row per task, then the whole run."""
    t = status.totals()
    source = "Slurm state from squeue/sacct" if status.slurm else "state from the directory alone"
    job = f"job {status.job_id}, " if status.job_id else ""
    lines = [f"{status.out}: {job}{len(status.tasks)} task(s); {source}"]
    header = ("task", "phase", "state", "shards", "rows", "failed", "requeues", "message")
    rows = [header]
    for x in status.tasks:
        rows.append(("-" if x.index is None else str(x.index), x.phase, x.state, _frac(x.shards_done, x.shards),
                     _frac(x.rows, x.rows_total), str(x.failed_rows), str(x.requeues), x.message or ""))
    rows.append(("all", status.phase, "", _frac(t["shards_done"], t["shards"]), _frac(t["rows"], t["rows_total"]),
                 str(t["failed_rows"]), str(t["requeues"]), ""))
    widths = [max(len(r[c]) for r in rows) for c in range(len(header) - 1)]
    for r in rows:
        lines.append("  ".join(v.ljust(w) for v, w in zip(r, widths)) + ("  " + r[-1] if r[-1] else ""))
    if len(status.configs) > 1:
        lines.append("parts made with different configurations:")
        lines += [f"  {line}" for line in history_lines(status.configs)]
    meaning = {EXIT_DONE: "done", EXIT_NOT_DONE: "not done yet", EXIT_FAILED: "failed"}[status.exit_code]
    lines.append(f"{meaning} (exit {status.exit_code})")
    return "\n".join(line.rstrip() for line in lines)


def _frac(done: int, total: int | None) -> str:
    return f"{done}/{'?' if total is None else total}"
