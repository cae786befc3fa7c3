"""Resume, fingerprint, lock and commit protocol (spcli/job/run.py, spcli/io/commit.py, spcli/io/manifest.py)."""

from __future__ import annotations

from tiny_models import ALWAYS_PRUNE
import dataclasses
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys

import orjson
import pytest

from spcli.config.run import GenerateConfig, RunConfig

from spcli.config.scoring import ScoreConfig, SelectConfig
from spcli.errors import Interrupted, OutputError
from spcli.io import commit
from spcli.io.lock import WriterLock, is_held
from spcli.io.manifest import Manifest, fingerprint, read_manifests
from spcli.job.progress import Progress
from spcli.job.run import run
from test_bad_input import cli, last_line
from test_job_run import read_outputs


def config(src, out, tiny_dir, keep: float = 0.3, **kw) -> RunConfig:
    return RunConfig(
        inputs=(str(src),), out=str(out), model=str(tiny_dir), speculator="self:2", dtype="float32",
        batch_size=kw.pop("batch_size", 2), commit_interval=kw.pop("commit_interval", 0.0),
        select=SelectConfig(keep=keep, chunk=8, keep_last=8, min_tokens=16, min_free=0, unit="chunk",
                            max_prune_cost=math.inf),  # as argv
        score=ScoreConfig(lookahead=2),
        generate=GenerateConfig(max_tokens=2), **kw,
    )


def argv(src, out, tiny_dir, *extra) -> list[str]:
    return ["run", str(src), "--out", str(out), "--model", str(tiny_dir), "--speculator", "self:2", "--dtype", "float32",
            "--batch-size", "2", "--commit-interval", "0", "--chunk", "8", "--keep-last", "8", "--min-tokens", "16", *ALWAYS_PRUNE,
            "--min-free", "0", "--unit", "chunk", "--lookahead", "2", "--max-tokens", "2", *extra]  # exact budgets: fixed chunks


class StopAfter(Progress):
    """Sends this process SIGUSR1 after `n` batches: the run commits and raises Interrupted."""

    def __init__(self, n: int):
        super().__init__(quiet=True)
        self.n = n

    def update(self, rows) -> None:
        super().update(rows)
        self.n -= 1
        if self.n == 0:
            os.kill(os.getpid(), signal.SIGUSR1)


def rows_of(n: int, dup_at: int | None = None) -> list[dict]:
    rows = [{"id": f"r{i}", "prompt": f"resume prompt {i} about topic {i % 3} " * 8} for i in range(n)]
    if dup_at is not None:
        rows.append({"id": f"r{dup_at}", "prompt": "a second r with the same id " * 3})
    return rows


def comparable(out) -> dict:
    keys = ("id", "output", "kept_indices", "finish_reason", "num_prompt_tokens", "error")
    return {r["row"]: tuple(tuple(r[k]) if isinstance(r[k], list) else r[k] for k in keys) for r in read_outputs(out)}


def test_resume_after_a_stop_equals_an_uninterrupted_run_and_keeps_catching_duplicates(tmp_path, tiny_dir, write_jsonl):
    src = write_jsonl(rows_of(10, dup_at=1))
    ref = tmp_path / "ref"
    run(config(src, ref, tiny_dir), Progress(quiet=True))
    out = tmp_path / "out"
    with pytest.raises(Interrupted, match=r"^stopped by SIGUSR1 with 4 of 11 rows committed; run the same command again"):
        run(config(src, out, tiny_dir), StopAfter(2))
    assert len(read_outputs(out)) == 4 and not (out / ".lock").exists()
    summary = run(config(src, out, tiny_dir), Progress(quiet=True))
    assert (summary.rows, summary.failed, summary.rows_total) == (11, 1, 11)
    assert comparable(out) == comparable(ref)
    dup = comparable(out)[10]
    assert dup[0] == "r1" and dup[-1] == f"{src}:row 10 (line 11): duplicate id 'r1' (first at {src}:row 1 (line 2)); ids must be unique"
    (doc,) = read_manifests(out)
    assert doc["finished"] and doc["summary"] == {
        "rows_total": 11, "rows": 11, "rows_ok": 10, "failed": 1, "prompt_tokens": doc["summary"]["prompt_tokens"],
        "kept_tokens": doc["summary"]["kept_tokens"], "wall_s": doc["summary"]["wall_s"], "shards": 1, "shards_done": 1}
    assert doc["summary"]["prompt_tokens"] > doc["summary"]["kept_tokens"] > 0 and doc["summary"]["wall_s"] > 0


def test_changed_keep_refuses_then_fresh_starts_over_and_force_appends(tmp_path, tiny_dir, write_jsonl, capsys):
    src = write_jsonl(rows_of(6))
    out = tmp_path / "out"
    with pytest.raises(Interrupted):
        run(config(src, out, tiny_dir), StopAfter(1))
    first = read_outputs(out)
    assert len(first) == 2

    code, _, err = cli(argv(src, out, tiny_dir, "--keep", "0.5"), capsys)
    assert code == 2
    assert last_line(err) == (f"spcli: error: {out} holds a run with another configuration (select.keep: 0.3 -> 0.5); "
                              "rerun with --fresh to start over (deletes its outputs) or --force to append anyway")

    code, _, err = cli(argv(src, out, tiny_dir, "--keep", "0.5", "--force"), capsys)
    assert code == 0, err
    assert "WARNING --force: appending to outputs made with another configuration (select.keep: 0.3 -> 0.5)" in err
    forced = {r["row"]: r for r in read_outputs(out)}
    assert sorted(forced) == list(range(6))
    assert [forced[i]["kept_indices"] for i in (0, 1)] == [r["kept_indices"] for r in first], "committed rows stay"
    n = forced[2]["num_prompt_tokens"]
    assert forced[2]["num_kept_tokens"] == -(-n // 2), "rows after the stop use keep 0.5"

    # the directory is finished now: another --force says that nothing was made with its configuration
    code, out_text, err = cli(argv(src, out, tiny_dir, "--keep", "0.2", "--force"), capsys)
    assert code == 0, err
    assert (f"WARNING --force: every shard in {out} is already done, so no row is made with this configuration "
            "(select.keep: 0.5 -> 0.2); its outputs are left as they were: --fresh redoes them with it, or give another "
            "--out\n") in err
    assert out_text.startswith("nothing to do: 6 rows already done")

    code, _, err = cli(argv(src, out, tiny_dir, "--keep", "0.3", "--fresh"), capsys)
    assert code == 0, err
    assert "INFO --fresh: removed the 3 committed output files of the earlier run\n" in err
    assert "uncommitted" not in err, "the issue: --fresh said 'removed 3 uncommitted file(s)' of committed outputs"
    fresh = {r["row"]: r for r in read_outputs(out)}
    assert sorted(fresh) == list(range(6))
    assert fresh[2]["num_kept_tokens"] == -(-3 * fresh[2]["num_prompt_tokens"] // 10)
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", *(f"part-00000-{i:05d}.parquet" for i in range(3))]


def test_a_directory_made_before_instructions_read_through_the_chat_template_is_refused(tmp_path, tiny_dir,
                                                                                           write_jsonl, capsys):
    """Issue 40: a raw prompt with an instruction reads through the chat template now; a directory whose rows were
    made before (raw text) is refused on resume, naming the change, rather than mixing the two forms."""
    src = write_jsonl([{"id": f"r{i}", "prompt": "word " * 40, "instruction": "Say yes."} for i in range(6)])
    out = tmp_path / "out"
    with pytest.raises(Interrupted):
        run(config(src, out, tiny_dir), StopAfter(1))
    path = out / "manifest.json"
    data = orjson.loads(path.read_bytes())
    assert data["fingerprint_fields"].pop("raw_prompt_with_instruction") == "chat template"
    for entry in data["configs"]:  # as a directory of the earlier code recorded it
        entry["fingerprint_fields"].pop("raw_prompt_with_instruction")
        entry["fingerprint"] = fingerprint(entry["fingerprint_fields"])
    path.write_bytes(orjson.dumps(data))
    code, _, err = cli(argv(src, out, tiny_dir, "--keep", "0.3"), capsys)
    assert code == 2
    assert "holds a run with another configuration (raw_prompt_with_instruction: None -> 'chat template')" in err


def test_a_changed_speculator_chunk_resumes_with_the_same_outputs(tmp_path, tiny_dir, write_jsonl, capsys):
    """--speculator-chunk changes memory, not outputs: not fingerprinted, and a resumed run that prefills
    the speculator 3 tokens at a time continues the rows of an unchunked one exactly."""
    src = write_jsonl(rows_of(6))
    ref = tmp_path / "ref"
    run(config(src, ref, tiny_dir), Progress(quiet=True))
    out = tmp_path / "out"
    with pytest.raises(Interrupted):
        run(config(src, out, tiny_dir), StopAfter(1))
    assert config(src, out, tiny_dir, speculator_chunk=3).fingerprint_fields() == config(src, out, tiny_dir).fingerprint_fields()
    code, _, err = cli(argv(src, out, tiny_dir, "--keep", "0.3", "--speculator-chunk", "3"), capsys)
    assert code == 0, err
    assert "another configuration" not in err
    assert comparable(out) == comparable(ref)
    code, _, err = cli(argv(src, tmp_path / "bad", tiny_dir, "--speculator-chunk", "0"), capsys)
    assert (code, last_line(err)) == (2, "spcli: error: --speculator-chunk must be >= 1, got 0")


def test_changed_input_file_refuses_to_resume(tmp_path, tiny_dir, write_jsonl, capsys):
    src = write_jsonl(rows_of(2))
    out = tmp_path / "out"
    assert cli(argv(src, out, tiny_dir), capsys)[0] == 0
    size = src.stat().st_size
    with open(src, "a") as f:
        f.write(json.dumps({"id": "new", "prompt": "appended later"}) + "\n")
    code, _, err = cli(argv(src, out, tiny_dir), capsys)
    assert code == 2
    line = last_line(err)
    assert "(inputs.0.mtime_ns: " in line and f"inputs.0.size: {size} -> {src.stat().st_size})" in line


def test_unreadable_manifest_and_missing_part_are_clear_errors(tmp_path, tiny_dir, write_jsonl, capsys):
    src = write_jsonl(rows_of(4))
    out = tmp_path / "out"
    assert cli(argv(src, out, tiny_dir), capsys)[0] == 0
    (out / "part-00000-00001.parquet").unlink()
    code, _, err = cli(argv(src, out, tiny_dir), capsys)
    assert (code, last_line(err)) == (2, f"spcli: error: {out}: committed part file(s) missing (part-00000-00001.parquet); "
                                         "the outputs are incomplete: rerun with --fresh to start over")
    (out / "manifest.json").write_text('{"version": 1, "shar')
    code, _, err = cli(argv(src, out, tiny_dir), capsys)
    assert code == 2 and last_line(err).startswith(f"spcli: error: {out}/manifest.json: manifest is unreadable (JSONDecodeError: ")
    assert last_line(err).endswith("; rerun with --fresh to start over")
    assert cli(argv(src, out, tiny_dir, "--fresh"), capsys)[0] == 0
    assert len(read_outputs(out)) == 4


def test_uncommitted_parts_and_temp_files_are_removed_at_start(tmp_path, tiny_dir, write_jsonl):
    src = write_jsonl(rows_of(4))
    out = tmp_path / "out"
    with pytest.raises(Interrupted):
        run(config(src, out, tiny_dir), StopAfter(1))
    committed = {p.name: p.read_bytes() for p in out.glob("part-*")}
    strays = ["part-00000-00001.parquet", ".part-00000-00002.parquet.123-abcd.tmp", ".manifest.json.99-beef.tmp"]
    for name in strays:
        (out / name).write_bytes(b"half written")
    (out / "part-00007-00000.parquet").write_bytes(b"not mine")  # a shard index outside this run: still unlisted
    (out / "notes.txt").write_text("a user's file")
    run(config(src, out, tiny_dir), Progress(quiet=True))
    names = sorted(p.name for p in out.iterdir())
    assert names == ["manifest.json", "notes.txt", "part-00000-00000.parquet", "part-00000-00001.parquet"]
    assert (out / "part-00000-00000.parquet").read_bytes() == committed["part-00000-00000.parquet"]
    assert len(read_outputs(out)) == 4


def test_remove_uncommitted_leaves_other_tasks_shards_alone(tmp_path):
    for name in ["part-00000-00000.parquet", "part-00001-00000.parquet", ".part-00001-00001.jsonl.1-aa.tmp",
                 "part-00000-00001.openai.jsonl", ".manifest-task-00001.json.3-cc.tmp", ".manifest.json.4-dd.tmp"]:
        (tmp_path / name).write_bytes(b"")
    removed = commit.remove_uncommitted(tmp_path, {"part-00000-00000.parquet"}, {0}, "manifest-task-00000.json")
    assert removed == ["part-00000-00001.openai.jsonl"]
    removed = commit.remove_uncommitted(tmp_path, {"part-00000-00000.parquet"}, {1}, "manifest-task-00001.json")
    assert sorted(removed) == [".manifest-task-00001.json.3-cc.tmp", ".part-00001-00001.jsonl.1-aa.tmp", "part-00001-00000.parquet"]
    assert commit.part_shard(".part-00012-00003.openai.jsonl.77-ab12.tmp") == 12
    assert commit.part_shard("part-00012-123456.parquet") == 12


def test_a_live_lock_refuses_at_once_and_a_stale_one_is_taken_over(tmp_path, tiny_dir, write_jsonl, capsys):
    src = write_jsonl(rows_of(2))
    out = tmp_path / "out"
    out.mkdir()
    held = WriterLock(out, None)
    held.acquire()
    try:
        assert is_held(out / ".lock")
        code, _, err = cli(argv(src, out, tiny_dir), capsys)
        assert (code, last_line(err)) == (2, f"spcli: error: {out}: another spcli run writes here (host {socket.gethostname()}, "
                                             f"pid {os.getpid()}); wait for it, or remove {out}/.lock if that run is gone")
    finally:
        held.release()
    assert not (out / ".lock").exists() and not is_held(out / ".lock")

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    (out / ".lock").write_bytes(orjson.dumps({"host": socket.gethostname(), "pid": pid, "job": None}))
    assert not is_held(out / ".lock"), "spcli status: a lock whose writer is gone is not a running run"
    code, _, err = cli(argv(src, out, tiny_dir), capsys)
    assert code == 0, err
    assert f"WARNING taking over a stale lock {out}/.lock (host {socket.gethostname()}, pid {pid})" in err
    assert not (out / ".lock").exists()


def test_a_lock_from_another_host_is_not_taken_over(tmp_path):
    (tmp_path / ".lock").write_bytes(orjson.dumps({"host": "other-node-7", "pid": 4242, "job": "123"}))
    assert is_held(tmp_path / ".lock"), "its process cannot be checked from this host"
    with pytest.raises(OutputError) as e:
        WriterLock(tmp_path, None).acquire()
    assert str(e.value) == (f"{tmp_path}: another spcli run writes here (host other-node-7, pid 4242); "
                            f"wait for it, or remove {tmp_path}/.lock if that run is gone")
    os.environ["SLURM_JOB_ID"] = "123"  # the same job, requeued on another node: its old attempt is gone
    try:
        lock = WriterLock(tmp_path, None, warn=lambda m: None)
        lock.acquire()
        lock.release()
    finally:
        del os.environ["SLURM_JOB_ID"]


def test_manifest_loads_older_and_newer_shard_fields(tmp_path):
    m = Manifest(tmp_path / "manifest.json", {}, {"a": 1}, {})
    m.save()
    doc = orjson.loads((tmp_path / "manifest.json").read_bytes())
    doc["shards"] = {"0": {"path": "x.jsonl", "next_row": 3, "parts": ["part-00000-00000.parquet"], "future_field": 1}}
    (tmp_path / "manifest.json").write_bytes(orjson.dumps(doc))
    loaded = Manifest.load(tmp_path / "manifest.json")
    assert loaded.shards[0].next_row == 3 and loaded.shards[0].openai_parts == [] and loaded.shards[0].total_rows is None


def test_a_plain_run_refuses_to_clean_up_beside_an_unreadable_manifest(tmp_path, tiny_dir, write_jsonl, capsys):
    src = write_jsonl(rows_of(2))
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest-task-00001.json").write_text("{")
    (out / "part-00001-00000.parquet").write_bytes(b"maybe committed by task 1")
    code, _, err = cli(argv(src, out, tiny_dir), capsys)
    assert code == 2 and last_line(err).startswith(f"spcli: error: {out}/manifest-task-00001.json: manifest is unreadable (")
    assert (out / "part-00001-00000.parquet").exists()


def test_each_shard_resumes_on_its_own(tmp_path, tiny_dir, write_jsonl):
    import pyarrow as pa
    import pyarrow.parquet as pq

    a = write_jsonl(rows_of(3), "a.jsonl")
    b = tmp_path / "b.parquet"
    pq.write_table(pa.table({"id": [f"b{i}" for i in range(5)], "prompt": [f"parquet prompt {i} " * 6 for i in range(5)]}),
                   b, row_group_size=2)
    ref, out = tmp_path / "ref", tmp_path / "out"

    def cfg(o):
        return dataclasses.replace(config(a, o, tiny_dir), inputs=(str(a), str(b)))

    run(cfg(ref), Progress(quiet=True))
    with pytest.raises(Interrupted, match=r"with 5 of 8 rows committed"):
        run(cfg(out), StopAfter(3))  # batches: a[0:2], a[2:3], b[0:2] -> stop
    (doc,) = read_manifests(out)
    assert [(s["done"], s["next_row"], s["rows"]) for s in doc["shards"].values()] == [(True, 3, 3), (False, 2, 2)]
    run(cfg(out), Progress(quiet=True))
    assert comparable_by_id(out) == comparable_by_id(ref)


def comparable_by_id(out) -> dict:
    keys = ("output", "kept_indices", "finish_reason", "num_prompt_tokens", "error")
    return {r["id"]: tuple(tuple(r[k]) if isinstance(r[k], list) else r[k] for k in keys) for r in read_outputs(out)}


def snapshot(d) -> dict | None:
    """Every file under d with its bytes (None: d does not exist)."""
    if not d.exists():
        return None
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_failed_starts_leave_the_output_directory_as_it_was(tmp_path, tiny_dir, write_jsonl, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = write_jsonl(rows_of(2))
    cols = tmp_path / "cols.parquet"
    pq.write_table(pa.table({"doc_id": ["d0", "d1"], "text": ["a parquet prompt " * 6, "another one " * 6]}), cols)
    broken = tmp_path / "broken-model"  # config and tokenizer, but the weights are missing
    shutil.copytree(tiny_dir, broken, ignore=shutil.ignore_patterns("*.safetensors"))
    finished = tmp_path / "finished"
    assert cli(argv(src, finished, tiny_dir), capsys)[0] == 0
    failures = {  # kind -> (argv, the error line)
        "missing input": (argv(tmp_path / "nope.jsonl", "{out}", tiny_dir), f"{tmp_path / 'nope.jsonl'}: no such file or directory"),
        "unknown model": ([*argv(src, "{out}", tiny_dir), "--model", "no-such-model"], "unknown model 'no-such-model'"),
        "missing speculator": ([*argv(src, "{out}", tiny_dir), "--speculator", "nobody/not-cached"],
                               "model 'nobody/not-cached' (nobody/not-cached) is not on this machine"),
        "wrong column": (argv(cols, "{out}", tiny_dir), f"{cols}: Parquet file has no 'prompt' or 'messages' column "
                                                        "(columns: doc_id, text); name yours with --prompt-field or --messages-field"),
        "model fails to load": ([*argv(src, "{out}", tiny_dir), "--model", str(broken)], f"cannot load model from {broken}: "),
    }
    for kind, (args, message) in failures.items():
        for where in ("new", "empty", "finished", "finished --fresh"):
            out = tmp_path / f"{kind}-{where}".replace(" ", "_")
            if where == "empty":
                out.mkdir()
            elif where.startswith("finished"):
                shutil.copytree(finished, out)
            before = snapshot(out)
            extra = ["--fresh"] if where.endswith("--fresh") else []
            code, _, err = cli([str(out) if a == "{out}" else a for a in args] + extra, capsys)
            expected = message
            if (kind, where) == ("model fails to load", "finished"):  # a model that loads would be refused too
                expected = "holds a run with another configuration (model: "
            assert code == 2 and expected in last_line(err), (kind, where, err)
            assert snapshot(out) == before, f"{kind} ({where}) changed the output directory"
    out = tmp_path / "wrong_column-new"
    code, _, err = cli([*argv(cols, out, tiny_dir), "--prompt-field", "text", "--id-field", "doc_id"], capsys)
    assert code == 0, err
    assert sorted(r["id"] for r in read_outputs(out)) == ["d0", "d1"]


def test_a_manifest_without_committed_parts_never_refuses_another_configuration(tmp_path, tiny_dir, write_jsonl, capsys):
    src = write_jsonl(rows_of(2))
    out = tmp_path / "out"
    out.mkdir()
    Manifest(out / "manifest.json", {"select": {"keep": 0.9}}, {"select": {"keep": 0.9}}, {}).save()  # an older spcli's
    code, _, err = cli(argv(src, out, tiny_dir), capsys)
    assert code == 0, err
    (doc,) = read_manifests(out)
    assert doc["config"]["select"]["keep"] == 0.1 and len(doc["configs"]) == 1


def test_force_keeps_the_history_of_earlier_parts(tmp_path, tiny_dir, write_jsonl, capsys):
    src = write_jsonl(rows_of(6))
    out = tmp_path / "out"
    with pytest.raises(Interrupted):
        run(config(src, out, tiny_dir), StopAfter(1))
    assert cli(argv(src, out, tiny_dir, "--keep", "0.5", "--force"), capsys)[0] == 0
    (doc,) = read_manifests(out)
    first, second = doc["configs"]
    assert (first["config"]["select"]["keep"], first["parts"], first["rows"]) == (0.3, ["part-00000-00000.parquet"], 2)
    assert (second["config"]["select"]["keep"], second["rows"]) == (0.5, 4)
    assert second["parts"] == ["part-00000-00001.parquet", "part-00000-00002.parquet"]
    assert doc["config"] == second["config"], "a plain resume matches the latest configuration"
    history = ["1: 2 rows in 1 part (from part-00000-00000.parquet): the first configuration",
               "2: 4 rows in 2 parts (from part-00000-00001.parquet): select.keep: 0.3 -> 0.5"]
    code, shown, _ = cli(["inspect", str(out), "--width", "200"], capsys)
    lines = [line.rstrip() for line in shown.splitlines()]
    assert code == 0 and f"history          {history[0]}" in lines and f"                 {history[1]}" in lines, shown
    code, shown, _ = cli(["status", str(out), "--no-slurm"], capsys)
    assert code == 0 and f"parts made with different configurations:\n  {history[0]}\n  {history[1]}\ndone (exit 0)" in shown

    code, out_text, err = cli(argv(src, out, tiny_dir, "--keep", "0.7", "--force"), capsys)
    assert (code, out_text) == (0, f"nothing to do: 6 rows already done; outputs in {out}\n")
    assert "so no row is made with this configuration (select.keep: 0.5 -> 0.7)" in err, "it says --force did nothing"
    assert read_manifests(out) == [doc], "a finished directory's manifest is not rewritten"


def test_rerun_of_a_finished_directory_and_a_resumed_run_say_where_they_stand(tmp_path, tiny_dir, write_jsonl, capsys):
    src = write_jsonl(rows_of(6))
    out = tmp_path / "out"
    with pytest.raises(Interrupted):
        run(config(src, out, tiny_dir), StopAfter(1))
    code, out_text, err = cli(argv(src, out, tiny_dir, "--keep", "0.3"), capsys)
    assert code == 0, err
    assert f"INFO resuming: 2 of 6 rows done, shard {src} at record 2 of its group order (--groups shard)\n" in err
    rows = read_outputs(out)
    total = (sum(r["num_prompt_tokens"] for r in rows), sum(r["num_kept_tokens"] for r in rows))
    late = (sum(r["num_prompt_tokens"] for r in rows[2:]), sum(r["num_kept_tokens"] for r in rows[2:]))
    pct = lambda t: f"{100 * t[1] / t[0]:.1f}%"
    assert re.fullmatch(
        rf"done: 6 rows in total \(0 failed\), prompt tokens {total[0]}, kept {total[1]} \({pct(total)}\); "
        rf"this run: 4 new rows, prompt tokens {late[0]}, kept {late[1]} \({pct(late)}\), output tokens \d+, \d+\.\d s "
        rf"\(\d+ prompt tok/s, \d+\.\d output tok/s\); outputs in {out}\n",
        out_text), out_text
    assert f"kept {pct(late)}, failed 0" in err, "the progress line's keep percentage is the done line's"
    code, out_text, err = cli(argv(src, out, tiny_dir, "--keep", "0.3"), capsys)
    assert (code, out_text, err) == (0, f"nothing to do: 6 rows already done; outputs in {out}\n", "")


def test_rows_is_fingerprinted_only_when_it_is_not_the_mean_older_runs_used():
    """--rows max changes outputs; mean (what every run before --rows did) leaves the fingerprint as it was, so their
    directories resume."""
    cfg = lambda rows: RunConfig(inputs=("x",), out="o", score=ScoreConfig(lookahead=2, rows=rows)).fingerprint_fields()
    assert "rows" not in cfg(None)["score"] and cfg("mean") == cfg(None)
    assert cfg("max")["score"]["rows"] == "max"


def test_keep_auto_records_its_criterion_so_older_auto_outputs_do_not_resume_silently():
    fields = lambda keep, **kw: RunConfig(inputs=("x",), out="o", select=SelectConfig(keep=keep, **kw)).fingerprint_fields()
    assert fields("auto")["select"]["auto_criterion"] == "perplexity-unpooled"
    assert fields("auto")["select"]["keep_scale"] == 1.5 and "keep_mass" not in fields("auto")["select"]
    assert fields("auto", keep_scale=2.0) != fields("auto")
    # fixed keeps: the fingerprint is as it was before keep_scale (keep_mass at its old default), so their
    # directories resume; keep_scale does not change their outputs
    fixed = fields(0.1)["select"]
    assert "auto_criterion" not in fixed and "keep_scale" not in fixed and fixed["keep_mass"] == 0.8
    assert fields(0.1, keep_scale=3.0) == fields(0.1)


def test_instructions_after_the_prompt_are_fingerprinted_and_before_reads_as_older_directories():
    """Directories made before --instruction-at put instructions before the prompt: their fingerprint has no such
    field, so they resume with --instruction-at before, and the new default (after) is refused on them, by name."""
    from spcli.config.run import FieldConfig, RunConfig

    after = RunConfig(inputs=("x",), out="y").fingerprint_fields()
    before = RunConfig(inputs=("x",), out="y", fields=FieldConfig(instruction_at="before")).fingerprint_fields()
    assert after["fields"]["instruction_at"] == "after" and "instruction_at" not in before["fields"]
    assert {k: v for k, v in after["fields"].items() if k != "instruction_at"} == before["fields"]
