"""The real `spcli run` as a Slurm job array on the local cluster (tests/slurm/cluster.sh), on the tiny
random model: a whole array, USR1 mid-run with a self-requeue, preemption by the `high` partition, a
task that fails for real, and the --dry-run script.

Tasks are kept short: a task starts in ~2-5 s. The signalled tests commit every row (--batch-size 1
--commit-interval 0) and pause COMMIT_PAUSE_S after each (spcli's test hook), so a shard takes at least
ROWS x COMMIT_PAUSE_S however idle the machine is, and is still running when it is signalled after
its first commit. A requeued task restarts ~6 s after it requeues itself (cred_expire=5).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from spcli.cli import app
from spcli.io.commit import PAUSE_AFTER_RENAME_ENV
from spcli.io.manifest import read_manifests
from spcli.slurm.attempts import read_attempts

pytestmark = pytest.mark.xdist_group("slurm")  # under `make test`'s two workers, one worker: the cluster is shared

SPCLI = str(Path(sys.executable).parent / "spcli")
FAST = ["--keep", "0.3", "--min-tokens", "16", "--keep-last", "8", "--chunk", "8", "--max-tokens", "1",
        "--dtype", "float32", "--lookahead", "1", "--speculator", "self:2", "--device", "cpu"]
SLOW = ["--batch-size", "1", "--commit-interval", "0"]  # one commit per row: signals land mid-shard
COMMIT_PAUSE_S = "0.3"  # spcli.io.commit.PAUSE_AFTER_RENAME_ENV: a floor on the time per row
ROWS = 20  # rows per shard for the signalled tests: >= 6 s of work
PREEMPT_ROWS = 40  # tasks start seconds apart and preemption takes a few more: <= ~20 rows are done by then


@pytest.fixture(autouse=True)
def one_thread_per_task(monkeypatch):
    """Jobs inherit the environment: torch's threads would oversubscribe this machine's few cores."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.fixture
def slow_commits(monkeypatch):
    monkeypatch.setenv(PAUSE_AFTER_RENAME_ENV, COMMIT_PAUSE_S)


def write_shards(folder: Path, num_shards: int, rows: int) -> list[str]:
    """Shards s0.jsonl ... with ids s<k>r<i>; returns every id."""
    folder.mkdir(parents=True)
    ids = []
    for k in range(num_shards):
        with open(folder / f"s{k}.jsonl", "w") as f:
            for i in range(rows):
                ids.append(f"s{k}r{i}")
                words = " ".join(f"w{(i * 7 + j) % 50}" for j in range(60))
                f.write(json.dumps({"id": ids[-1], "prompt": words}) + "\n")
    return ids


def submit(inputs: Path, out: Path, *options: str, run_args=()) -> str:
    res = CliRunner().invoke(app, ["slurm", "submit", str(inputs), "--out", str(out), "--gpus-per-task", "0",
                                   "--cpus-per-task", "1",  # the test cluster's node has 2 CPUs (a CPU model's default: 8)
                                   "--spcli", SPCLI, *options, "--", *run_args])
    assert res.exit_code == 0, f"{res.output}\n{res.exception!r}"
    return res.stdout.split()[2].rstrip(":")  # "submitted job 12: ..."


def output_rows(out: Path) -> list[tuple[str, int]]:
    """(id, row) of every committed output row, from every task's manifest."""
    rows = []
    for doc in read_manifests(out):
        for shard in doc["shards"].values():
            for part in shard["parts"]:
                t = pq.read_table(out / part, columns=["id", "row"])
                rows += zip(t.column("id").to_pylist(), t.column("row").to_pylist())
    return rows


def assert_each_id_once(out: Path, ids: list[str]) -> None:
    rows = output_rows(out)
    assert sorted(i for i, _ in rows) == sorted(ids)  # nothing lost, nothing twice


def status(out: Path) -> tuple[int, dict]:
    res = CliRunner().invoke(app, ["status", str(out), "--json"])
    return res.exit_code, json.loads(res.stdout)


def committed_rows(out: Path, task: int) -> int:
    path = out / f"manifest-task-{task:05d}.json"
    try:
        return json.loads(path.read_bytes())["summary"]["rows"]
    except (OSError, ValueError, KeyError):
        return 0


def task_logs(out: Path) -> str:
    """The last lines of each task's Slurm log: for a failure message."""
    logs = sorted((out / "slurm" / "logs").glob("*.out"))
    return "\n".join(f"{log.name}, last 30 lines:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-30:])
                     for log in logs) or "no task log yet"


def wait_until_committed(slurm_cluster, out: Path, tasks: range, timeout: float) -> None:
    """Until each task has committed a row (so it is mid-shard, past start-up)."""
    deadline = time.monotonic() + timeout
    while not all(committed_rows(out, t) >= 1 for t in tasks):
        assert time.monotonic() < deadline, (f"no commit from tasks {list(tasks)} in {timeout:.0f} s\n"
                                             f"{task_logs(out)}\n{slurm_cluster.report()}")
        time.sleep(0.1)


def attempts(out: Path, task: int = 0) -> list[tuple[int, int, str]]:
    return [(a.restart, a.exit, a.action) for a in read_attempts(out).get(task, [])]


@pytest.mark.slurm
def test_array_over_six_shards_with_three_tasks(slurm_cluster, tmp_path, tiny_dir):
    ids = write_shards(tmp_path / "data", 6, 2)
    out = tmp_path / "out"
    job = submit(tmp_path / "data", out, "--tasks", "3", run_args=["--model", str(tiny_dir), *FAST])

    rows = slurm_cluster.wait_for_job(job, timeout=120, tasks=3)

    assert sorted((r["job"], r["state"]) for r in rows) == [(f"{job}_{i}", "COMPLETED") for i in range(3)]
    assert_each_id_once(out, ids)
    for i in range(3):  # round robin: task i ran shards i and i+3
        (doc,) = [d for d in read_manifests(out) if d["task"]["index"] == i]
        assert [Path(s["path"]).name for s in doc["shards"].values()] == [f"s{i}.jsonl", f"s{i + 3}.jsonl"]
        assert (doc["task"]["count"], doc["task"]["job_id"], doc["finished"]) == (3, job, True)
    code, doc = status(out)
    assert code == 0, doc
    assert (doc["phase"], doc["rows"], doc["rows_total"], doc["shards_done"], doc["requeues"]) == ("done", 12, 12, 6, 0)
    assert [(t["index"], t["state"]) for t in doc["tasks"]] == [(i, "COMPLETED") for i in range(3)]


@pytest.mark.slurm
def test_usr1_mid_run_commits_requeues_and_resumes(slurm_cluster, tmp_path, tiny_dir, slow_commits):
    ids = write_shards(tmp_path / "data", 1, ROWS)
    out = tmp_path / "out"
    job = submit(tmp_path / "data", out, "--tasks", "1", run_args=["--model", str(tiny_dir), *FAST, *SLOW])
    wait_until_committed(slurm_cluster, out, range(1), timeout=60)

    slurm_cluster.run("scancel", "--batch", "--signal=USR1", f"{job}_0")
    rows = slurm_cluster.wait_for_job(job, timeout=120, tasks=1)

    assert [r["state"] for r in rows] == ["COMPLETED"]
    assert attempts(out) == [(0, 75, "requeue"), (1, 0, "done")]
    assert [r["state"] for r in slurm_cluster.sacct_rows(job, duplicates=True)] == ["REQUEUED", "COMPLETED"]
    log = (out / "slurm" / "logs" / f"{job}_0.out").read_text()
    assert f"of {ROWS} rows committed; run the same command again to resume" in log  # stopped mid-shard
    (doc,) = read_manifests(out)
    assert doc["task"]["restart_count"] == 1  # SLURM_RESTART_COUNT, as the resumed attempt saw it
    rows_out = output_rows(out)
    assert sorted(r for _, r in rows_out) == list(range(ROWS))  # each row once: none lost, none repeated
    assert_each_id_once(out, ids)
    code, doc = status(out)
    assert (code, doc["phase"], doc["requeues"], doc["rows"]) == (0, "done", 1, ROWS)


@pytest.mark.slurm
def test_preemption_requeues_the_victims_which_finish(slurm_cluster, tmp_path, tiny_dir, slow_commits):
    ids = write_shards(tmp_path / "data", 2, PREEMPT_ROWS)
    out = tmp_path / "out"
    low = submit(tmp_path / "data", out, "--tasks", "2", "--partition", "debug",
                 run_args=["--model", str(tiny_dir), *FAST, *SLOW])
    wait_until_committed(slurm_cluster, out, range(2), timeout=60)

    high = slurm_cluster.sbatch("--partition=high", "--exclusive", "--output=/dev/null", "--wrap", "sleep 1")
    high_rows = slurm_cluster.wait_for_job(high, timeout=60)
    low_rows = slurm_cluster.wait_for_job(low, timeout=150, tasks=2)

    assert [r["state"] for r in high_rows] == ["COMPLETED"]
    assert sorted(r["state"] for r in low_rows) == ["COMPLETED", "COMPLETED"]
    history = slurm_cluster.sacct_rows(low, duplicates=True)
    for task in range(2):
        states = [r["state"] for r in history if r["job"] == f"{low}_{task}"]
        assert states[-1] == "COMPLETED" and set(states[:-1]) <= {"REQUEUED", "PREEMPTED"} and states[:-1], history
        restarted = [r for r in history if r["job"] == f"{low}_{task}"][-1]
        assert restarted["start"] >= high_rows[0]["end"]  # it ran again after the preemptor
        # preempt_send_user_signal: USR1 first; spcli committed, exited 75 and the task requeued itself
        assert attempts(out, task)[0][1:] == (75, "requeue")
        assert attempts(out, task)[-1][1:] == (0, "done")
    assert_each_id_once(out, ids)
    code, doc = status(out)
    assert (code, doc["phase"], doc["rows"]) == (0, "done", 2 * PREEMPT_ROWS)
    assert all(t["requeues"] >= 1 for t in doc["tasks"])


@pytest.mark.slurm
def test_preemption_during_start_up_loses_nothing(slurm_cluster, tmp_path, tiny_dir, slow_commits):
    # USR1 may reach spcli before Python has installed its handler and kill it (srun exits 138): the
    # script treats that as resumable. Or srun drops it before the step starts, and TERM at the end
    # of GraceTime stops spcli, which Slurm requeues. Whichever happens, the task must not fail.
    ids = write_shards(tmp_path / "data", 1, ROWS)
    out = tmp_path / "out"
    job = submit(tmp_path / "data", out, "--tasks", "1", "--partition", "debug",
                 run_args=["--model", str(tiny_dir), *FAST, *SLOW])
    slurm_cluster.wait_for_path(out / "slurm" / "logs" / f"{job}_0.out")  # the batch script runs

    high = slurm_cluster.sbatch("--partition=high", "--exclusive", "--output=/dev/null", "--wrap", "sleep 1")
    slurm_cluster.wait_for_job(high, timeout=60)
    rows = slurm_cluster.wait_for_job(job, timeout=120, tasks=1)

    assert [r["state"] for r in rows] == ["COMPLETED"]
    found = attempts(out)
    assert found[-1][1:] == (0, "done") and all(action in ("requeue", "stopped") for _, _, action in found[:-1]), found
    assert_each_id_once(out, ids)
    assert status(out)[0] == 0


@pytest.mark.slurm
def test_a_real_failure_is_not_requeued_and_status_says_why(slurm_cluster, tmp_path):
    write_shards(tmp_path / "data", 1, 2)
    out = tmp_path / "out"
    job = submit(tmp_path / "data", out, "--tasks", "1", "--max-requeues", "2", run_args=["--model", "no-such-model"])

    rows = slurm_cluster.wait_for_job(job, timeout=60, tasks=1)

    assert [(r["state"], r["exit"]) for r in rows] == [("FAILED", "2:0")]
    assert attempts(out) == [(0, 2, "failed")]
    assert [r["state"] for r in slurm_cluster.sacct_rows(job, duplicates=True)] == ["FAILED"]  # ran once
    proc = subprocess.run([SPCLI, "status", str(out)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "unknown model 'no-such-model'" in proc.stdout
    code, doc = status(out)
    (task,) = doc["tasks"]
    assert (code, doc["phase"], task["state"], task["exit_code"]) == (4, "failed", "FAILED", 2)
    assert task["message"].startswith("exit 2: unknown model 'no-such-model'")


def test_dry_run_script_is_valid_bash_with_array_signal_and_requeue(tmp_path):
    write_shards(tmp_path / "data", 3, 1)
    out = tmp_path / "out"
    proc = subprocess.run([SPCLI, "slurm", "submit", str(tmp_path / "data"), "--out", str(out), "--tasks", "3",
                           "--parallel", "2", "--signal-lead", "90", "--dry-run", "--", "--keep", "0.2"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    script = tmp_path / "printed.sbatch"
    script.write_text(proc.stdout)
    check = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "#!/bin/bash"
    for line in ("#SBATCH --array=0-2%2", "#SBATCH --signal=B:USR1@90", "#SBATCH --requeue"):
        assert line in lines
    assert 'scontrol requeue "$job"' in proc.stdout
    assert not out.exists()  # nothing written, nothing submitted
