"""`spcli status` without a cluster: from the directory alone, and from stand-in squeue/sacct."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from spcli.cli import app
from spcli.errors import OutputError
from spcli.io.lock import WriterLock
from spcli.io.manifest import Manifest, ShardProgress, manifest_name
from spcli.slurm import query
from spcli.slurm.status import EXIT_DONE, EXIT_FAILED, EXIT_NOT_DONE, collect, render
from spcli.slurm.submit import SUBMISSIONS, Submission

SHARDS = [f"/data/s{i}.jsonl" for i in range(6)]  # 3 tasks: 0 -> s0 s3, 1 -> s1 s4, 2 -> s2 s5


def submission(out: Path, job: str = "77", tasks: int = 3, shards=SHARDS) -> None:
    (out / "slurm" / "logs").mkdir(parents=True, exist_ok=True)
    record = Submission(job, tasks, tuple(shards), 0.0, 3)
    with open(out / "slurm" / SUBMISSIONS, "ab") as f:
        f.write(orjson.dumps(dataclasses.asdict(record)) + b"\n")


def manifest(out: Path, index: int | None, progress: dict[str, tuple], job: str = "77", count: int = 3,
             restart: int = 0, finished: bool = False) -> None:
    """progress: shard path -> (rows, total_rows, done, failed rows)."""
    shards = {i: ShardProgress(p, next_row=rows, rows=rows, total_rows=total, done=done, failed=failed)
              for i, (p, (rows, total, done, failed)) in enumerate(progress.items())}
    task = None if index is None else {"index": index, "count": count, "job_id": job, "restart_count": restart}
    Manifest(out / manifest_name(index), {}, {"inputs": [{"path": p} for p in progress]}, shards, task,
             finished=finished).save()


def attempt(out: Path, task: int, restart: int, code: int, action: str, job: str = "77") -> None:
    (out / "slurm").mkdir(parents=True, exist_ok=True)
    with open(out / "slurm" / f"attempts-{task}.log", "a") as f:
        f.write(f"time=2026-01-01T00:00:0{restart}Z task={task} restart={restart} exit={code} action={action} "
                f"job={job}_{task} host=n{task}\n")


def by_task(status):
    return {t.index: t for t in status.tasks}


def test_progress_per_task_and_overall_from_the_directory(tmp_path):
    submission(tmp_path)
    manifest(tmp_path, 0, {SHARDS[0]: (4, 4, True, 1), SHARDS[3]: (5, 5, True, 0)}, finished=True)
    attempt(tmp_path, 0, 0, 0, "done")
    manifest(tmp_path, 1, {SHARDS[1]: (4, 4, True, 0), SHARDS[4]: (2, 6, False, 0)}, restart=0)
    attempt(tmp_path, 1, 0, 75, "requeue")

    status = collect(tmp_path, ask_slurm=False)

    t = by_task(status)
    assert (t[0].phase, t[0].state, t[0].shards, t[0].shards_done, t[0].rows, t[0].rows_total, t[0].failed_rows) == (
        "done", "DONE", 2, 2, 9, 9, 1)
    assert (t[1].phase, t[1].state, t[1].rows, t[1].rows_total, t[1].requeues, t[1].exit_code) == (
        "waiting", "REQUEUED", 6, 10, 1, 75)
    assert (t[2].phase, t[2].state, t[2].shards, t[2].rows, t[2].rows_total) == ("waiting", "NOT_STARTED", 2, 0, None)
    assert (status.phase, status.exit_code, status.slurm, status.job_id) == ("waiting", EXIT_NOT_DONE, False, "77")
    assert status.totals() == {"shards": 6, "shards_done": 3, "rows": 15, "failed_rows": 1, "rows_total": None,
                               "requeues": 1}
    lines = render(status).splitlines()
    assert lines[0] == f"{tmp_path}: job 77, 3 task(s); state from the directory alone"
    assert lines[1].split() == ["task", "phase", "state", "shards", "rows", "failed", "requeues", "message"]
    assert lines[2].split() == ["0", "done", "DONE", "2/2", "9/9", "1", "0"]
    assert lines[5].split() == ["all", "waiting", "3/6", "15/?", "1", "1"]
    assert lines[-1] == "not done yet (exit 3)"


def test_all_done_exits_0_with_json(tmp_path):
    submission(tmp_path, tasks=2, shards=SHARDS[:3])
    manifest(tmp_path, 0, {SHARDS[0]: (2, 2, True, 0), SHARDS[2]: (3, 3, True, 0)}, count=2, finished=True)
    manifest(tmp_path, 1, {SHARDS[1]: (1, 1, True, 1)}, count=2, restart=2, finished=True)

    res = CliRunner().invoke(app, ["status", str(tmp_path), "--json", "--no-slurm"])

    assert res.exit_code == EXIT_DONE, res.output
    doc = json.loads(res.output)
    assert {k: doc[k] for k in ("phase", "exit_code", "rows", "rows_total", "failed_rows", "shards", "requeues")} == {
        "phase": "done", "exit_code": 0, "rows": 6, "rows_total": 6, "failed_rows": 1, "shards": 3, "requeues": 2}
    assert [(t["index"], t["phase"], t["requeues"]) for t in doc["tasks"]] == [(0, "done", 0), (1, "done", 2)]


def test_more_tasks_than_shards_the_extra_tasks_are_done(tmp_path):
    submission(tmp_path, tasks=3, shards=SHARDS[:1])
    manifest(tmp_path, 0, {SHARDS[0]: (2, 2, True, 0)}, finished=True)
    assert [(t.index, t.phase, t.shards) for t in collect(tmp_path, ask_slurm=False).tasks] == [
        (0, "done", 1), (1, "done", 0), (2, "done", 0)]


def test_failed_task_reports_the_message_from_its_log(tmp_path):
    submission(tmp_path, tasks=1, shards=SHARDS[:1])
    attempt(tmp_path, 0, 0, 2, "failed")
    (tmp_path / "slurm" / "logs" / "77_0.out").write_text(
        "spcli-slurm: task 77_0 attempt 1 on n0 at 2026-01-01T00:00:00Z\n"
        "spcli: error: unknown model 'no-such-model': use one of smollm2-135m\n"
        "srun: error: n0: task 0: Exited with exit code 2\n"
        "spcli-slurm: task 77_0 exit 2: failed\n")

    res = CliRunner().invoke(app, ["status", str(tmp_path), "--no-slurm"])

    assert res.exit_code == EXIT_FAILED, res.output
    (task,) = collect(tmp_path, ask_slurm=False).tasks
    assert (task.phase, task.state, task.exit_code) == ("failed", "FAILED", 2)
    assert task.message == "exit 2: unknown model 'no-such-model': use one of smollm2-135m"
    assert "exit 2: unknown model 'no-such-model'" in res.output
    assert res.output.splitlines()[-1] == "failed (exit 4)"


def test_message_comes_from_the_last_attempt_only(tmp_path):
    submission(tmp_path, tasks=1, shards=SHARDS[:1])
    attempt(tmp_path, 0, 0, 75, "requeue")
    attempt(tmp_path, 0, 1, 1, "failed")
    (tmp_path / "slurm" / "logs" / "77_0.out").write_text(
        "spcli-slurm: task 77_0 attempt 1 on n0 at x\nspcli: error: old trouble\n"
        "spcli-slurm: task 77_0 attempt 2 on n0 at y\nspcli: internal error: KeyError: 'x' (rerun with --debug)\n")
    (task,) = collect(tmp_path, ask_slurm=False).tasks
    assert (task.phase, task.requeues, task.message) == ("failed", 1, "exit 1: internal error: KeyError: 'x' (rerun with --debug)")


def test_out_of_requeues_is_failed(tmp_path):
    submission(tmp_path, tasks=1, shards=SHARDS[:1])
    manifest(tmp_path, 0, {SHARDS[0]: (3, 9, False, 0)}, count=1, restart=1)
    attempt(tmp_path, 0, 0, 75, "requeue")
    attempt(tmp_path, 0, 1, 75, "gave-up")
    (task,) = collect(tmp_path, ask_slurm=False).tasks
    assert (task.phase, task.state, task.requeues, task.rows, task.rows_total) == ("failed", "GAVE_UP", 1, 3, 9)
    assert "--max-requeues" in task.message and "resubmit" in task.message


def test_stopped_task_is_unknown_or_running_when_it_holds_its_lock(tmp_path):
    submission(tmp_path, tasks=1, shards=SHARDS[:1])
    manifest(tmp_path, 0, {SHARDS[0]: (3, 9, False, 0)}, count=1)
    attempt(tmp_path, 0, 0, 75, "stopped")
    (task,) = collect(tmp_path, ask_slurm=False).tasks
    assert (task.phase, task.state) == ("unknown", "STOPPED")
    assert collect(tmp_path, ask_slurm=False).exit_code == EXIT_NOT_DONE
    (tmp_path / ".lock-task-00000").write_text(orjson.dumps({"host": socket.gethostname(), "pid": 1 << 22}).decode())
    (task,) = collect(tmp_path, ask_slurm=False).tasks
    assert (task.phase, task.state) == ("unknown", "STOPPED"), "a lock nobody holds (its writer was killed) is stale"
    lock = WriterLock(tmp_path, 0)  # Slurm requeued it; a later attempt runs
    lock.acquire()
    try:
        (task,) = collect(tmp_path, ask_slurm=False).tasks
    finally:
        lock.release()
    assert (task.phase, task.state) == ("running", "RUNNING")


def test_attempts_of_an_earlier_job_are_ignored(tmp_path):
    submission(tmp_path, job="50", tasks=1, shards=SHARDS[:1])
    attempt(tmp_path, 0, 0, 2, "failed", job="50")
    submission(tmp_path, job="60", tasks=1, shards=SHARDS[:1])  # resubmitted after fixing the model name
    (task,) = collect(tmp_path, ask_slurm=False).tasks
    assert (task.phase, task.state, task.exit_code) == ("waiting", "NOT_STARTED", None)


def test_without_a_submission_record_tasks_come_from_the_manifests(tmp_path):
    # A hand-written sbatch script calling `spcli run`: no slurm/ records at all.
    manifest(tmp_path, 1, {SHARDS[1]: (2, 2, True, 0)}, job="9", count=3, finished=True)
    manifest(tmp_path, 0, {SHARDS[0]: (1, 2, False, 0)}, job="9", count=3)
    # task 0 runs on another node (a shared file system): its lock is not checked from here, only read
    (tmp_path / ".lock-task-00000").write_text(orjson.dumps({"host": "node-elsewhere", "pid": 7}).decode())
    status = collect(tmp_path, ask_slurm=False)
    assert status.job_id == "9"
    assert [(t.index, t.phase, t.state, t.shards) for t in status.tasks] == [
        (0, "running", "RUNNING", 1), (1, "done", "DONE", 1), (2, "waiting", "NOT_STARTED", None)]
    assert status.totals()["shards"] is None


def test_a_plain_run_directory(tmp_path):
    manifest(tmp_path, None, {SHARDS[0]: (2, 5, False, 0)})
    (task,) = collect(tmp_path).tasks
    assert (task.index, task.phase, task.state, task.rows, task.rows_total) == (None, "unknown", "INTERRUPTED", 2, 5)
    manifest(tmp_path, None, {SHARDS[0]: (5, 5, True, 0)}, finished=True)
    status = collect(tmp_path)
    assert (status.phase, status.exit_code, status.job_id) == ("done", 0, None)
    assert render(status).splitlines()[2].split()[:2] == ["-", "done"]


@pytest.mark.parametrize("make", [lambda p: p / "missing", lambda p: p])
def test_not_an_output_directory_exits_2(tmp_path, make):
    res = CliRunner().invoke(app, ["status", str(make(tmp_path))])
    assert isinstance(res.exception, OutputError) and res.exception.exit_code == 2  # main() turns it into exit 2


# --- squeue / sacct


def test_parse_squeue_and_sacct():
    squeue = "77_0|RUNNING|None\n77_1|PENDING|BeginTime\n78_0|RUNNING|None\n77_2|COMPLETED|None\n"
    assert query.parse_squeue(squeue, "77") == {
        0: query.TaskState("RUNNING"), 1: query.TaskState("PENDING", "BeginTime"), 2: query.TaskState("COMPLETED")}
    sacct = "77_0|COMPLETED|0:0\n77_1|CANCELLED by 0|0:15\n77_[2-4,6%2]|PENDING|0:0\n770_1|FAILED|2:0\n"
    states = query.parse_sacct(sacct, "77")
    assert {i: (s.state, s.exit_code) for i, s in states.items()} == {
        0: ("COMPLETED", 0), 1: ("CANCELLED", 0), 2: ("PENDING", 0), 3: ("PENDING", 0), 4: ("PENDING", 0),
        6: ("PENDING", 0)}


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """squeue and sacct stand-ins printing $FAKE_SQUEUE / $FAKE_SACCT (unset: the command fails)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("squeue", "sacct"):
        var = f"FAKE_{name.upper()}"
        (bin_dir / name).write_text(f'#!/bin/bash\n[ -n "${{{var}+x}}" ] || exit 1\nprintf "%b" "${var}"\n')
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    out = tmp_path / "out"
    out.mkdir()

    def set_output(squeue=None, sacct=None):
        for var, value in (("FAKE_SQUEUE", squeue), ("FAKE_SACCT", sacct)):
            if value is None:
                monkeypatch.delenv(var, raising=False)
            else:
                monkeypatch.setenv(var, value)

    set_output.out = out
    return set_output


def test_query_prefers_squeue_and_takes_exit_codes_from_sacct(fake_slurm):
    fake_slurm(squeue=r"77_0|PENDING|BeginTime\n77_1|FAILED|None\n",
               sacct=r"77_0|FAILED|75:0\n77_1|FAILED|2:0\n77_2|COMPLETED|0:0\n")
    assert query.query("77") == {0: query.TaskState("PENDING", "BeginTime", None, "squeue"),
                                 1: query.TaskState("FAILED", None, 2, "squeue"),
                                 2: query.TaskState("COMPLETED", None, 0, "sacct")}
    fake_slurm(squeue=None, sacct=None)
    assert query.query("77") is None


def test_slurm_states_decide_the_phase(fake_slurm):
    out = fake_slurm.out
    submission(out, tasks=5, shards=SHARDS[:5])
    manifest(out, 4, {SHARDS[4]: (1, 1, True, 0)}, count=5, finished=True)
    fake_slurm(squeue=r"77_0|RUNNING|None\n77_1|PENDING|Priority\n",
               sacct=r"77_2|CANCELLED by 0|0:15\n77_3|COMPLETED|0:0\n77_4|COMPLETED|0:0\n")
    status = collect(out)
    assert status.slurm
    assert [(t.phase, t.state, t.message) for t in status.tasks] == [
        ("running", "RUNNING", None), ("waiting", "PENDING", "reason: Priority"),
        ("failed", "CANCELLED", "cancelled"),
        ("failed", "COMPLETED", "ended with exit 0 but 1 of 1 shard(s) are not done"),
        ("done", "COMPLETED", None)]
    assert status.exit_code == EXIT_FAILED
    assert render(status).splitlines()[0].endswith("Slurm state from squeue/sacct")


def test_slurm_kill_line_is_the_message_when_spcli_wrote_none(fake_slurm):
    out = fake_slurm.out
    submission(out, tasks=1, shards=SHARDS[:1])
    attempt(out, 0, 0, 75, "stopped")
    (out / "slurm" / "logs" / "77_0.out").write_text(
        "spcli-slurm: task 77_0 attempt 1 on n0 at x\n"
        "spcli: interrupted: stopped by SIGTERM with 3 of 9 rows committed; run the same command again to resume\n"
        "srun: error: n0: task 0: Exited with exit code 75\n"
        "slurmstepd-n0: error: *** JOB 77 ON n0 DUE TO TIME LIMIT ***\n"
        "slurmstepd-n0: error: *** STEP 77.0 ON n0 DUE TO TIME LIMIT ***\n")
    fake_slurm(squeue="", sacct=r"77_0|TIMEOUT|0:0\n")
    (task,) = collect(out).tasks
    assert (task.phase, task.state, task.message) == (
        "failed", "TIMEOUT", "time limit reached: *** JOB 77 ON n0 DUE TO TIME LIMIT ***")
