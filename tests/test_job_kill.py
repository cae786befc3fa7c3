"""SIGKILL at random moments and between part rename and manifest replace: no row lost, none twice.

Each attempt is a separate process running `spcli run` (spcli.cli.main), SIGKILLed by the test.
To fit ~25 restarts in well under two minutes on a busy 2-core machine, processes are forked from
a multiprocessing forkserver that has imported torch, transformers and spcli once (an import costs
3-10 s; a forked start only loads the tiny model, < 1 s). A killed child dies exactly as a fresh
`python -m spcli` would: nothing of its state survives but the files it wrote.

Chosen sizes: 306 input lines (300 prompts, 4 bad records, 2 duplicate ids), --batch-size 4,
--commit-interval 0 (a commit per batch: 77 commit points), --max-tokens 2; 26 kills: 2 during
start-up, 12 while paused between renaming a part and replacing the manifest
(SPCLI_TEST_PAUSE_AFTER_RENAME), 12 at random moments 0-50 ms after the first or second commit.
Each attempt commits at most a few batches, so all 26 kills land before the input is finished.
"""

from __future__ import annotations

from tiny_models import ALWAYS_PRUNE
import json
import multiprocessing
import os
import random
import signal
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from spcli.io.manifest import read_manifests

NUM_PROMPTS = 300
KILLS_AT_START, KILLS_AFTER_RENAME, KILLS_RANDOM = 2, 7, 7
ARGS = ["--batch-size", "4", "--commit-interval", "0", "--max-tokens", "2", "--keep", "0.3", "--min-tokens", "16", *ALWAYS_PRUNE,
        "--keep-last", "8", "--chunk", "8", "--lookahead", "2", "--speculator", "self:2", "--dtype", "float32"]


def _share_tqdm_lock() -> None:
    """tqdm makes a multiprocessing lock on first use: made once in the forkserver, not in each killed child."""
    from tqdm import tqdm

    tqdm.get_lock()


_share_tqdm_lock()  # at import, which the forkserver does once (preload) before forking the children


def _child(argv: list[str], env: dict, log_path: str) -> None:
    os.environ.update(env)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.argv = ["spcli", *argv]
    from spcli.cli import main

    main()


@pytest.fixture(scope="module")
def forkserver():
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "transformers", "spcli.cli", "spcli.job.run", "spcli.engines.hf.engine", __name__])
    return ctx


def kill_inputs(path: Path) -> list[str]:
    lines = []
    for i in range(NUM_PROMPTS):
        lines.append(json.dumps({"id": f"k{i}", "prompt": " ".join(f"w{(i * 7 + j) % 50}" for j in range(20 + i % 13))}))
        if i in (30, 120):
            lines.append("{not json")
        if i in (60, 170):
            lines.append(json.dumps({"id": f"bad{i}", "prompt": 7}))
        if i in (90, 180):
            lines.append(json.dumps({"id": f"k{i - 80}", "prompt": "a duplicate of an earlier id " * 3}))
    path.write_text("\n".join(lines) + "\n")
    return lines


def committed_rows(out: Path) -> list[dict]:
    rows = []
    for doc in read_manifests(out):
        for shard in doc["shards"].values():
            for name in shard["parts"]:
                rows += pq.read_table(out / name).to_pylist()
    return rows


def comparable(rows: list[dict]) -> dict:
    keys = ("id", "output", "finish_reason", "kept_indices", "num_prompt_tokens", "num_kept_tokens", "error")
    return {r["row"]: tuple(r[k] if not isinstance(r[k], list) else tuple(r[k]) for k in keys) for r in rows}


def check_committed_state(out: Path) -> int:
    """After any kill: every committed part is whole, rows are contiguous from 0, none twice."""
    docs = read_manifests(out)
    if not docs:
        return 0
    (doc,) = docs
    rows = committed_rows(out)
    got = sorted(r["row"] for r in rows)
    (shard,) = doc["shards"].values()
    assert len(got) == len(set(got)), "a row committed twice"
    assert shard["rows"] == len(rows)
    if rows and shard.get("order") == "groups":  # --groups shard: next_row counts records of the group order
        assert shard["next_row"] == len(rows)
    elif rows:
        assert shard["next_row"] == got[-1] + 1
    listed = set(shard["parts"])
    assert all((out / p).is_file() for p in listed)
    return len(rows)


def wait_for(log: Path, marker: str, count: int, proc, timeout: float = 60.0) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if log.exists() and log.read_text(errors="replace").count(marker) >= count:
            return True
        if not proc.is_alive():
            return False
        time.sleep(0.01)
    raise AssertionError(f"no {marker!r} x{count} in {timeout} s: {log.read_text(errors='replace')[-2000:]}")


def test_sigkill_anywhere_loses_no_row_and_repeats_none(tmp_path, tiny_dir, forkserver):
    t_start = time.monotonic()
    src = tmp_path / "kill.jsonl"
    lines = kill_inputs(src)
    argv = ["-q", "run", str(src), "--model", str(tiny_dir), *ARGS]
    env = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}

    def start(out: Path, log: Path, extra_env: dict):
        p = forkserver.Process(target=_child, args=([*argv, "--out", str(out)], {**env, **extra_env}, str(log)))
        p.start()
        return p

    ref_dir = tmp_path / "ref"
    p = start(ref_dir, tmp_path / "ref.log", {})
    p.join(120)
    assert p.exitcode == 0, (tmp_path / "ref.log").read_text()
    reference = comparable(committed_rows(ref_dir))
    assert sorted(reference) == list(range(len(lines)))

    rng = random.Random(1234)
    plan = ["start"] * KILLS_AT_START + ["rename"] * KILLS_AFTER_RENAME + ["random"] * KILLS_RANDOM
    rng.shuffle(plan)
    out = tmp_path / "out"
    kills, progress, times = 0, [], []
    for attempt, mode in enumerate(plan):
        t_att = time.monotonic()
        log = tmp_path / f"attempt{attempt}.log"
        pause = "0.15" if mode == "rename" else "0"
        p = start(out, log, {"SPCLI_TEST_PAUSE_AFTER_RENAME": pause})
        if mode == "start":
            time.sleep(rng.uniform(0.0, 0.8))
        elif mode == "rename":
            # the k-th commit is killed while its part is renamed but not yet in the manifest
            wait_for(log, "spcli-test: renamed", rng.randint(2, 3), p)
        else:  # anywhere in the next batch or two: reading, the model, writing, renaming, the manifest
            wait_for(log, "spcli-test: renamed", rng.randint(1, 2), p)
            time.sleep(rng.uniform(0.0, 0.05))
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
            kills += 1
        p.join(30)
        assert p.exitcode != 0, f"the input was finished after {kills} kills: give it more rows"
        assert p.exitcode == -signal.SIGKILL, log.read_text(errors="replace")[-2000:]
        progress.append(check_committed_state(out))
        times.append(round(time.monotonic() - t_att, 1))
    assert kills == len(plan) >= 16

    log = tmp_path / "final.log"
    p = start(out, log, {})
    p.join(120)
    assert p.exitcode == 0, log.read_text(errors="replace")
    rows = committed_rows(out)
    assert sorted(r["row"] for r in rows) == list(range(len(lines))), "every input line exactly once"
    expected_ids = []
    for n, line in enumerate(lines):
        try:
            expected_ids.append(json.loads(line)["id"])
        except json.JSONDecodeError:
            expected_ids.append(f"kill:{n}")
    assert sorted(r["id"] for r in rows) == sorted(expected_ids)
    dups = [r for r in rows if r["error"] and "duplicate id" in r["error"]]
    assert sorted(r["id"] for r in dups) == ["k10", "k100"]
    assert comparable(rows) == reference
    leftovers = sorted(f.name for f in out.iterdir() if f.name != "manifest.json" and not f.name.startswith("part-"))
    assert leftovers == [], leftovers
    elapsed = time.monotonic() - t_start
    print(f"\n{kills} kills; committed rows after each: {progress}; seconds per attempt: {times}; total {elapsed:.1f} s")


def test_sigkill_in_a_run_whose_groups_are_out_of_order_resumes_with_every_id_once(tmp_path, tiny_dir, forkserver):
    """Documents' questions shuffled through the shard (--groups shard reads them in its group order, not in rows):
    a few SIGKILLs, between a part's rename and the manifest or anywhere, then a resume: every id once, each row as
    a run without kills made it (issue 57)."""
    from test_stages_share import QUESTIONS

    rng = random.Random(57)
    docs = [" ".join(f"fact{d}-{j} holds value {(d * 31 + j) % 97}." for j in range(12)) for d in range(20)]
    rows = [{"id": f"d{d}q{q}", "prompt": doc, "question": question.format(d=d)}
            for d, doc in enumerate(docs) for q, question in enumerate(QUESTIONS)]
    rows = rng.sample(rows, len(rows))
    rows.insert(17, {"id": "bad", "prompt": docs[3], "question": "?", "n": 2})  # an error row inside d3's group
    src = tmp_path / "qa.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["-q", "run", str(src), "--model", str(tiny_dir), "--instruction-field", "question", *ARGS]
    env = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}

    def start(out: Path, log: Path, extra_env: dict):
        p = forkserver.Process(target=_child, args=([*argv, "--out", str(out)], {**env, **extra_env}, str(log)))
        p.start()
        return p

    p = start(tmp_path / "ref", tmp_path / "ref.log", {})
    p.join(120)
    assert p.exitcode == 0, (tmp_path / "ref.log").read_text()
    reference = comparable(committed_rows(tmp_path / "ref"))
    out = tmp_path / "out"
    for attempt, mode in enumerate(["rename", "random", "rename", "random"]):
        log = tmp_path / f"attempt{attempt}.log"
        p = start(out, log, {"SPCLI_TEST_PAUSE_AFTER_RENAME": "0.15" if mode == "rename" else "0"})
        wait_for(log, "spcli-test: renamed", rng.randint(1, 2), p)
        if mode == "random":
            time.sleep(rng.uniform(0.0, 0.05))
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
        p.join(30)
        assert p.exitcode == -signal.SIGKILL, log.read_text(errors="replace")[-2000:]
        check_committed_state(out)
    p = start(out, tmp_path / "final.log", {})
    p.join(120)
    assert p.exitcode == 0, (tmp_path / "final.log").read_text(errors="replace")
    got = committed_rows(out)
    assert sorted(r["id"] for r in got) == sorted(r["id"] for r in rows), "every id exactly once"
    assert comparable(got) == reference
    assert {r["group_size"] for r in got if r["error"] is None} == {3}
