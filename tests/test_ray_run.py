"""`spcli run --ray` on a real local Ray cluster (tests/conftest.py `ray_cluster`: 2 CPUs, loopback), hf engine,
tiny model: the same rows as `spcli run`; an actor SIGKILLed mid-job; a driver SIGKILLed and resumed.

Drivers run in-process (CliRunner, joining the session's cluster) or as `python -m spcli` subprocesses given the
cluster's address, as a user's would be. An actor's process is found by its slot's lock file (host, pid).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spcli.cli import app
from spcli.errors import OutputError
from spcli.io.manifest import progress_key
from spcli.ray.pieces import uncovered
from spcli.slurm.status import collect
from test_job_run import read_outputs
from tiny_models import ALWAYS_PRUNE

pytestmark = pytest.mark.xdist_group("ray")  # one worker: the Ray tests share the session's cluster

ARGS = ["--keep", "0.3", "--min-tokens", "16", *ALWAYS_PRUNE, "--min-free", "0", "--unit", "chunk", "--keep-last", "8", "--chunk", "8",
        "--max-tokens", "4", "--dtype", "float32", "--lookahead", "2", "--speculator", "self:2",
        "--batch-size", "2", "--commit-interval", "0",
        "--groups", "consecutive"]  # row ranges: --groups shard (the default) runs each file whole (ray.pieces.group_split_rows)
DEADLINE_S = 240


def make_shards(tmp_path: Path, num_shards: int, rows: int, bad_in: int | None = 1) -> list[str]:
    """JSONL shards of `rows` prompts each (ids s<k>r<i>); shard `bad_in` ends with a malformed line."""
    paths = []
    for k in range(num_shards):
        path = tmp_path / f"in{k}.jsonl"
        lines = [json.dumps({"id": f"s{k}r{i}", "prompt": " ".join(f"word{(i * 7 + j + k) % 50}" for j in range(60 + 9 * i))})
                 for i in range(rows)]
        if k == bad_in:
            lines.append('{"id": "broken", "prompt": ')
        path.write_text("\n".join(lines) + "\n")
        paths.append(str(path))
    return paths


def comparable(rows: list[dict]) -> dict[str, tuple]:
    return {r["id"]: (r["output"], r["kept_indices"], r["num_prompt_tokens"], r["error"]) for r in rows}


def assert_exactly_once(rows: list[dict], expected: int) -> None:
    counts = Counter(r["id"] for r in rows)
    assert [i for i, c in counts.items() if c > 1] == []
    assert len(counts) == expected


def driver(inputs: list[str], out: Path, model: Path, address: str, *more: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "spcli", "run", *inputs, "--out", str(out), "--model", str(model), *ARGS,
            "--ray", address, "--ray-workers", "2", *more]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def committed(out: Path) -> list[tuple[int, dict]]:
    """(slot, shard progress) for every shard a slot's manifest lists."""
    found = []
    for path in out.glob("manifest-task-*.json"):
        try:
            doc = json.loads(path.read_bytes())
        except (OSError, ValueError):
            continue  # never half-written (atomic replace); gone between glob and read at worst
        found += [(doc["task"]["index"], p) for p in doc["shards"].values()]
    return found


def lock_pid(out: Path, slot: int) -> int | None:
    try:
        return json.loads((out / f".lock-task-{slot:05d}").read_bytes())["pid"]
    except (OSError, ValueError, KeyError):
        return None


def is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def poll(what: str, check, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the driver ended (exit {proc.returncode}) before {what}:\n{proc.stdout.read()[-3000:]}")
        time.sleep(0.02)
    pytest.fail(f"no {what} within {DEADLINE_S} s")


def test_ray_run_same_rows_as_plain_run(tmp_path, tiny_dir, ray_cluster):
    inputs = make_shards(tmp_path, 3, 4)
    plain, on_ray = tmp_path / "plain", tmp_path / "ray"
    # --group-max 3: Ray's ranges are cut at multiples of it (a group never spans two), so --split-rows 3 stands
    res = CliRunner().invoke(app, ["run", *inputs, "--out", str(plain), "--model", str(tiny_dir), *ARGS, "--group-max", "3"])
    assert res.exit_code == 0, res.output
    cmd = ["run", *inputs, "--out", str(on_ray), "--model", str(tiny_dir), *ARGS, "--group-max", "3", "--ray"]
    res = CliRunner().invoke(app, [*cmd, "--ray-workers", "2", "--split-rows", "3"])  # each file in 2 row ranges
    assert res.exit_code == 0, res.output
    assert "done: 13 rows (1 failed" in res.output and "in 6 units (6 row ranges)" in res.output
    rows = read_outputs(on_ray)
    assert_exactly_once(rows, 13)
    assert comparable(rows) == comparable(read_outputs(plain))
    [bad] = [r for r in rows if r["error"] is not None]
    assert bad["error"].startswith(f"{inputs[1]}:row 4 (line 5): malformed JSON")
    assert sorted(p.name for p in on_ray.glob("manifest*.json")) == ["manifest-task-00000.json", "manifest-task-00001.json"]
    ranges = sorted((p["path"], *p["row_range"], p["rows"]) for _, p in committed(on_ray))
    assert ranges == [(inputs[0], 0, 3, 3), (inputs[0], 3, 4, 1), (inputs[1], 0, 3, 3), (inputs[1], 3, 5, 2),
                      (inputs[2], 0, 3, 3), (inputs[2], 3, 4, 1)]
    status = CliRunner().invoke(app, ["status", str(on_ray)])
    assert status.exit_code == 0 and "6/6" in status.output, status.output
    again = CliRunner().invoke(app, [*cmd, "--split-rows", "2"])  # the ranges listed stand, whatever --split-rows says
    assert again.exit_code == 0 and again.output.startswith("nothing to do: 13 rows already done"), again.output
    refused = CliRunner().invoke(app, ["run", *inputs, "--out", str(on_ray), "--model", str(tiny_dir), *ARGS])
    assert isinstance(refused.exception, OutputError) and "made by spcli run --ray" in str(refused.exception)
    # --retry-failed: the malformed line mended in place, its slot (alone) redoes its error row where it was
    Path(inputs[1]).write_text(Path(inputs[1]).read_text().replace('"prompt": \n', '"prompt": "mended"}\n'))
    retry = CliRunner().invoke(app, [*cmd, "--ray-workers", "2", "--retry-failed", "--force"])
    assert retry.exit_code == 0, retry.output
    assert "this run: 0 new rows, 1 failed row redone (1 now without error)" in retry.output, retry.output
    assert "ray: 1 actor(s) (of 2: the others would have nothing to do)" in retry.output  # one slot has error rows
    rows = read_outputs(on_ray)
    assert_exactly_once(rows, 13)
    assert [r["id"] for r in rows if r["error"] is None and r["row"] == 4] == ["broken"]
    # --fresh: the slots' manifests and parts go, the job runs again (here with another max_tokens), each id once
    (on_ray / ".part-00000-00009.parquet.77-zz.tmp").write_bytes(b"left by a killed writer")
    fresh = CliRunner().invoke(app, [*cmd, "--ray-workers", "1", "--max-tokens", "2", "--fresh"])  # whole files
    assert fresh.exit_code == 0, fresh.output
    assert "--fresh: removed 2 manifest(s) and" in fresh.output and "done: 13 rows (" in fresh.output
    again = read_outputs(on_ray)
    assert_exactly_once(again, 13)
    assert not list(on_ray.glob(".part-*.tmp"))
    assert all(r["num_output_tokens"] <= 2 for r in again if r["error"] is None)
    assert [p.name for p in on_ray.glob("manifest*.json")] == ["manifest-task-00000.json"]
    assert not any("row_range" in p for _, p in committed(on_ray))


def test_ray_actor_killed_then_driver_killed_every_id_once(tmp_path, tiny_dir, ray_cluster):
    """One job, two deaths: an actor SIGKILLed mid-range (its slot is taken over by a new actor from its last
    commit), then the driver SIGKILLed (its actors end with it); the same command, run again (with another
    --split-rows: only the rows no manifest lists are cut by it), finishes the job with every id exactly once. The
    files are cut in row ranges of 8 (30 rows each: 4 ranges); enough rows that the other actor cannot finish the
    job while the killed one's replacement starts. (One job for both: each start of a driver and its actors costs
    ~10 s of imports.)"""
    n = 30
    inputs = make_shards(tmp_path, 5, n)
    out = tmp_path / "out"
    proc = driver(inputs, out, tiny_dir, ray_cluster, "--split-rows", "8")
    try:
        def victim():  # an actor with a committed part of a range it has not finished
            for slot, prog in committed(out):
                if prog["parts"] and not prog["done"]:
                    pid = lock_pid(out, slot)
                    return pid and (slot, pid, progress_key(prog), prog["rows"])

        slot, pid, key, rows_then = poll("actor mid-range", victim, proc)
        assert re.search(r"\[\d+:\d+\]$", key), key
        os.kill(pid, signal.SIGKILL)

        def taken_over():  # a new actor holds the slot and has committed more of that range
            rows = [p["rows"] for s, p in committed(out) if s == slot and progress_key(p) == key]
            new = lock_pid(out, slot)
            return new not in (None, pid) and rows and rows[0] > rows_then and new

        new_pid = poll("takeover of the killed actor's slot", taken_over, proc)
        pids = {new_pid, *(p for s in range(2) if (p := lock_pid(out, s)))}
        proc.kill()  # the driver, mid-job
        output, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert f"takes over slot {slot}" in output, output
    assert not is_alive(pid)
    poll("end of the killed driver's actors", lambda: not any(map(is_alive, pids)))  # Ray ends a dead driver's actors
    before = sum(p["rows"] for _, p in committed(out))  # what they committed, up to their end
    assert 0 < before < 5 * n + 1, "the driver was killed mid-job"
    status = collect(out)  # squeue/sacct are on this machine: a Ray run's id must not be asked of them
    assert (status.job_id, status.slurm) == (None, False)
    slots = {(t.phase, t.state) for t in status.tasks if t.index is not None}
    assert ("unknown", "INTERRUPTED") in slots and slots <= {("unknown", "INTERRUPTED"), ("done", "DONE")}, \
        f"the killed actors' lock files are left behind, but nobody holds them: {slots}"
    res = CliRunner().invoke(app, ["run", *inputs, "--out", str(out), "--model", str(tiny_dir), *ARGS,
                                   "--ray", "--ray-workers", "2", "--split-rows", "5"])
    assert res.exit_code == 0, res.output
    done = [line for line in res.output.splitlines() if line.startswith("done:")]
    assert done and done[0].startswith(f"done: {5 * n + 1} rows in total (1 failed"), res.output
    assert f"this run: {5 * n + 1 - before} new rows" in done[0]
    rows = read_outputs(out)
    assert_exactly_once(rows, 5 * n + 1)
    assert [r["id"] for r in rows if r["error"] is not None] == [f"in1:{n}"]
    assert all(p["done"] for _, p in committed(out))
    by_file = {}
    for _, p in committed(out):
        by_file.setdefault(p["path"], []).append(tuple(p["row_range"]))
    assert sorted(by_file) == sorted(inputs)
    for path, ranges in by_file.items():  # the first run's ranges and the resume's cuts tile each file exactly
        lines = n + 1 if path == inputs[1] else n
        assert uncovered(ranges, lines) == [] and sum(b - a for a, b in ranges) == lines, ranges
