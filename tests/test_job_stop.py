"""SIGTERM, SIGINT and SIGUSR1 commit what is finished, release the lock and exit 75; a resume completes.

Each signal goes to a real `python -m spcli run` process while it is paused right after renaming
its first part (SPCLI_TEST_PAUSE_AFTER_RENAME), so the moment is deterministic: the first part is
committed, then the run stops before the next batch.
"""

from __future__ import annotations

from tiny_models import ALWAYS_PRUNE
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spcli.cli import app
from spcli.errors import EXIT_INTERRUPTED
from spcli.io.manifest import read_manifests
from test_job_run import read_outputs

ARGS = ["--batch-size", "4", "--commit-interval", "0", "--max-tokens", "2", "--keep", "0.3", "--min-tokens", "16", *ALWAYS_PRUNE,
        "--keep-last", "8", "--chunk", "8", "--lookahead", "2", "--speculator", "self:2", "--dtype", "float32"]
NUM_ROWS = 12


def write_prompts(path: Path) -> Path:
    path.write_text("".join(json.dumps({"id": f"s{i}", "prompt": f"signal test prompt number {i} " * 4}) + "\n"
                            for i in range(NUM_ROWS)))
    return path


def start(args: list[str], log: Path, pause: float) -> subprocess.Popen:
    env = {**os.environ, "SPCLI_TEST_PAUSE_AFTER_RENAME": str(pause), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "spcli", "run", *args], stdout=subprocess.PIPE,
                            stderr=open(log, "wb"), env=env)


def wait_for_marker(proc: subprocess.Popen, log: Path, count: int = 1, timeout: float = 120.0) -> None:
    t0 = time.monotonic()
    while log.read_text(errors="replace").count("spcli-test: renamed") < count:
        assert proc.poll() is None, log.read_text(errors="replace")
        assert time.monotonic() - t0 < timeout, log.read_text(errors="replace")
        time.sleep(0.02)


def resume_and_check(args: list[str], out: Path, is_resumed: bool = True) -> None:
    res = CliRunner().invoke(app, ["run", *args])
    assert res.exit_code == 0, res.output
    if is_resumed:  # totals, then this run's
        assert f"done: {NUM_ROWS} rows in total (0 failed), " in res.output
    else:  # nothing was committed before: this run did every row
        assert f"done: {NUM_ROWS} rows (0 failed), " in res.output
    rows = read_outputs(out)
    assert sorted(r["id"] for r in rows) == sorted(f"s{i}" for i in range(NUM_ROWS))
    assert not (out / ".lock").exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1], ids=lambda s: s.name)
def test_signal_commits_exits_75_and_resumes(tmp_path, tiny_dir, sig):
    src = write_prompts(tmp_path / "in.jsonl")
    out = tmp_path / "out"
    args = [str(src), "--out", str(out), "--model", str(tiny_dir), *ARGS]
    log = tmp_path / "stderr.log"
    proc = start(args, log, pause=0.5)
    wait_for_marker(proc, log)
    proc.send_signal(sig)
    proc.wait(60)
    stderr = log.read_text(errors="replace")
    assert proc.returncode == EXIT_INTERRUPTED == 75, stderr
    assert f"spcli: interrupted: stopped by {sig.name} with 4 of {NUM_ROWS} rows committed; " \
           "run the same command again to resume" in stderr
    assert "Traceback" not in stderr
    if sig == signal.SIGINT:  # a person waits: the batch in flight stops at its next safe point
        said = ("SIGINT received: stopping the batch in flight at its next safe point (its rows are redone on "
                "resume), committing the finished rows and exiting (resumable); press Ctrl-C again to stop at once")
    else:  # Slurm gives a lead time: the batch in flight finishes
        said = f"{sig.name} received: finishing the batch in flight, then committing and exiting (resumable)"
    assert f"WARNING {said}\n" in stderr
    assert not (out / ".lock").exists(), "the lock is released"
    (doc,) = read_manifests(out)
    assert doc["summary"]["rows"] == 4 and not doc["finished"]
    assert len(read_outputs(out)) == 4
    resume_and_check(args, out)


def test_second_ctrl_c_exits_at_once_without_committing_the_batch(tmp_path, tiny_dir):
    src = write_prompts(tmp_path / "in.jsonl")
    out = tmp_path / "out"
    args = [str(src), "--out", str(out), "--model", str(tiny_dir), *ARGS]
    log = tmp_path / "stderr.log"
    proc = start(args, log, pause=5.0)
    wait_for_marker(proc, log)  # the first part is renamed, its manifest replace waits 5 s
    proc.send_signal(signal.SIGINT)
    time.sleep(0.2)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.wait(60)
    assert time.monotonic() - t0 < 4.0, "the second Ctrl-C does not wait for the commit"
    stderr = log.read_text(errors="replace")
    assert proc.returncode == 75, stderr
    assert "spcli: interrupted: stopped at once by a second SIGINT (the batch in flight was dropped); " \
           "run the same command again to resume" in stderr
    assert not (out / ".lock").exists()
    assert read_manifests(out) == [], "nothing was committed, so no manifest was written"
    assert (out / "part-00000-00000.parquet").exists(), "renamed but never committed: it does not count"
    resume_and_check(args, out, is_resumed=False)


def test_ctrl_c_stops_a_long_batch_at_its_next_safe_point(tmp_path, tiny_dir):
    """The second batch decodes 1500 tokens per row; a Ctrl-C 0.2 s into it stops between decode steps:
    exit 75 in a fraction of the time the batch takes (measured by the resume, which redoes it), only the
    first batch committed."""
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"s{i}", "prompt": f"signal test prompt number {i} " * 4,
                                       "max_tokens": 2 if i < 4 else 1500}) + "\n" for i in range(8)))
    out = tmp_path / "out"
    args = [str(src), "--out", str(out), "--model", str(tiny_dir), *ARGS]
    log = tmp_path / "stderr.log"
    proc = start(args, log, pause=0.0)
    wait_for_marker(proc, log)  # the first batch's part is renamed: the long batch starts now
    time.sleep(0.2)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.wait(120)
    took = time.monotonic() - t0
    stderr = log.read_text(errors="replace")
    assert proc.returncode == 75, stderr
    assert "WARNING the batch in flight (4 rows) was dropped at a safe point; it is redone on resume" in stderr
    assert "spcli: interrupted: stopped by SIGINT with 4 of 8 rows committed; run the same command again to resume" \
        in stderr
    assert sorted(r["id"] for r in read_outputs(out)) == ["s0", "s1", "s2", "s3"]
    t1 = time.monotonic()
    res = CliRunner().invoke(app, ["run", *args])  # the resume redoes the long batch
    batch_s = time.monotonic() - t1
    assert res.exit_code == 0, res.output
    assert took < 0.5 * batch_s, f"stopping took {took:.1f} s; the batch takes {batch_s:.1f} s"
    assert sorted(r["id"] for r in read_outputs(out)) == [f"s{i}" for i in range(8)]
