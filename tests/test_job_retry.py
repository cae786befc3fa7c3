"""Failed rows named as they happen, listed by `inspect --failed`, and redone by `run --retry-failed`
(spcli/job/retry.py, spcli/io/replace.py), also when the retry is SIGKILLed (commit invariants of test_job_kill)."""

from __future__ import annotations

import json
import os
import random
import signal
import time

from test_bad_input import cli
from test_job_kill import _child, committed_rows, forkserver, wait_for  # noqa: F401 (forkserver is a fixture)
from test_job_resume import argv

MALFORMED = '{"id": "bad", "prompt": "unterminated'


def long_and_short(n: int, bad_at: tuple[int, ...] = ()) -> list[str]:
    """Odd rows are long (> 150 bytes), even ones short; a malformed line after each row in bad_at."""
    lines = []
    for i in range(n):
        words = 40 if i % 2 else 8
        lines.append(json.dumps({"id": f"r{i}", "prompt": " ".join(f"w{(i * 7 + j) % 50}" for j in range(words))}))
        if i in bad_at:
            lines.append(MALFORMED)
    return lines


def by_row(out) -> dict[int, dict]:
    rows = committed_rows(out)
    assert len({r["row"] for r in rows}) == len(rows), "a row committed twice"
    return {r["row"]: r for r in rows}


def same(a: dict, b: dict) -> bool:
    keys = ("id", "output", "kept_indices", "num_prompt_tokens", "num_kept_tokens", "error")
    return all(a[k] == b[k] for k in keys)


def test_each_failed_row_is_named_then_counted_and_the_done_line_says_how_to_list_them(tmp_path, tiny_dir, write_jsonl, capsys):
    src = write_jsonl([*long_and_short(2), *[MALFORMED] * 11])
    out = tmp_path / "out"
    code, stdout, err = cli(argv(src, out, tiny_dir), capsys)
    assert code == 0, err
    warnings = [line for line in err.splitlines() if line.startswith(("WARNING failed row", "WARNING 1 more"))]
    assert warnings == [
        *(f"WARNING failed row 'in:{n}': {src}:row {n} (line {n + 1}): malformed JSON (unexpected end of data at column 38)"
          for n in range(2, 12)),
        "WARNING 1 more failed row not shown (the first 10 are above)",
    ]
    hint = f"11 failed: `spcli inspect {out} --failed` lists them, --retry-failed redoes them"
    assert stdout.startswith(f"done: 13 rows ({hint}), prompt tokens ")
    code, stdout, _ = cli(argv(src, out, tiny_dir), capsys)
    assert (code, stdout) == (0, f"nothing to do: 13 rows already done ({hint}); outputs in {out}\n")
    code, stdout, _ = cli(["inspect", str(out), "--failed"], capsys)
    assert code == 0 and stdout.splitlines() == [
        f"in:{n}\t{src}:row {n} (line {n + 1}): malformed JSON (unexpected end of data at column 38)" for n in range(2, 13)]


def test_retry_failed_redoes_exactly_the_error_rows_in_place(tmp_path, tiny_dir, write_jsonl, capsys):
    src = write_jsonl(long_and_short(6, bad_at=(2,)))
    ref, out = tmp_path / "ref", tmp_path / "out"
    assert cli(argv(src, ref, tiny_dir), capsys)[0] == 0
    assert cli(argv(src, out, tiny_dir, "--max-record-bytes", "150"), capsys)[0] == 0
    first = by_row(out)
    assert sorted(r for r, row in first.items() if row["error"]) == [1, 3, 4, 6]  # 3 long rows, 1 malformed
    code, stdout, err = cli(argv(src, out, tiny_dir, "--retry-failed"), capsys)
    assert code == 2 and "holds a run with another configuration (max_record_bytes: 150 -> 8388608)" in err
    code, stdout, err = cli(argv(src, out, tiny_dir, "--retry-failed", "--force"), capsys)
    assert code == 0, err
    assert "INFO retrying 4 failed rows" in err
    assert [line for line in err.splitlines() if line.startswith("WARNING")] == [
        f"WARNING failed row 'in:3': {src}:row 3 (line 4): malformed JSON (unexpected end of data at column 38)"]
    assert stdout.startswith(f"done: 7 rows in total (1 failed: `spcli inspect {out} --failed` lists them, "
                             "--retry-failed redoes them), prompt tokens ")
    assert "; this run: 0 new rows, 4 failed rows redone (3 now without error), prompt tokens " in stdout
    redone, reference = by_row(out), by_row(ref)
    assert sorted(redone) == list(range(7))
    assert all(same(redone[r], reference[r]) for r in redone), "redone rows equal an uninterrupted run's"
    assert all(redone[r] == first[r] for r in (0, 2, 5)), "good rows are left as they were"
    (doc,) = [json.loads((out / "manifest.json").read_text())]
    assert doc["summary"]["failed"] == 1
    assert (doc["summary"]["prompt_tokens"], doc["summary"]["kept_tokens"]) == (
        sum(r["num_prompt_tokens"] for r in reference.values()), sum(r["num_kept_tokens"] for r in reference.values()))
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", *sorted(doc["shards"]["0"]["parts"])]
    code, stdout, _ = cli(argv(src, out, tiny_dir, "--retry-failed", "--force"), capsys)
    assert code == 0 and "this run: 0 new rows, 1 failed row redone (0 now without error), prompt tokens 0, kept 0 (-)" in stdout
    assert by_row(out) == redone, "a still-bad record stays the same error row"


def test_sigkill_during_a_retry_replaces_error_rows_only_by_good_ones(tmp_path, tiny_dir, write_jsonl, forkserver):
    src = write_jsonl(long_and_short(20, bad_at=(5, 13)))
    env = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}

    def start(out, log, *extra, pause="0"):
        p = forkserver.Process(target=_child, args=(["-q", *argv(src, out, tiny_dir, *extra)],
                                                    {**env, "SPCLI_TEST_PAUSE_AFTER_RENAME": pause}, str(log)))
        p.start()
        return p

    ref, out = tmp_path / "ref", tmp_path / "out"
    for d, extra in ((ref, ()), (out, ("--max-record-bytes", "150"))):
        p = start(d, tmp_path / f"{d.name}.log", *extra)
        p.join(120)
        assert p.exitcode == 0, (tmp_path / f"{d.name}.log").read_text()
    reference, before = by_row(ref), by_row(out)
    assert sum(r["error"] is not None for r in before.values()) == 12  # 10 long rows, 2 malformed
    rng = random.Random(21)
    fixed = []
    for attempt in range(4):
        log = tmp_path / f"retry{attempt}.log"
        p = start(out, log, "--retry-failed", "--force", pause="0.15" if attempt % 2 else "0")
        wait_for(log, "spcli-test: renamed", 1, p)
        if attempt % 2 == 0:
            wait_for(log, "spcli-test: renamed", rng.randint(1, 2), p)
            time.sleep(rng.uniform(0.0, 0.05))
        assert p.is_alive(), "the retry finished before the kill: give it more rows"
        os.kill(p.pid, signal.SIGKILL)
        p.join(30)
        now = by_row(out)
        assert sorted(now) == sorted(before), "every input line exactly once"
        ids = [r["id"] for r in now.values()]
        assert len(ids) == len(set(ids)), "every id once"
        for row, r in now.items():
            assert same(r, before[row]) or (before[row]["error"] and same(r, reference[row])), row
        fixed.append(sum(r["error"] is None for r in now.values()) - sum(r["error"] is None for r in before.values()))
    assert fixed[-1] < 10 and fixed == sorted(fixed), fixed
    log = tmp_path / "final.log"
    p = start(out, log, "--retry-failed", "--force")
    p.join(120)
    assert p.exitcode == 0, log.read_text()
    final = by_row(out)
    assert all(same(final[r], reference[r]) for r in reference) and sorted(final) == sorted(reference)
    names = sorted(f.name for f in out.iterdir())
    listed = sorted(json.loads((out / "manifest.json").read_text())["shards"]["0"]["parts"])
    assert names == ["manifest.json", *listed], "no stray part or temp file"


def test_retry_failed_after_the_input_was_fixed_in_place_says_to_add_force(tmp_path, tiny_dir, write_jsonl, capsys):
    """The issue: --retry-failed after fixing the input in place was refused without suggesting --force."""
    lines = long_and_short(4, bad_at=(1,))
    src = write_jsonl(lines)
    out = tmp_path / "out"
    assert cli(argv(src, out, tiny_dir), capsys)[0] == 0
    lines[2] = json.dumps({"id": "fixed", "prompt": "now a good record"})  # the malformed line, mended in place
    write_jsonl(lines)
    code, _, err = cli(argv(src, out, tiny_dir, "--retry-failed"), capsys)
    assert code == 2
    assert f"spcli: error: {out}: the input files changed since its rows were made (inputs.0." in err
    assert "); --retry-failed --force redoes its failed rows from them (rows already made stay as they were), " \
           "--fresh redoes every row" in err
    code, stdout, err = cli(argv(src, out, tiny_dir, "--retry-failed", "--force"), capsys)
    assert code == 0, err
    assert "1 failed row redone (1 now without error)" in stdout
    assert by_row(out)[2]["id"] == "fixed" and by_row(out)[2]["error"] is None


def test_a_redone_row_gets_its_pass_through_columns_from_the_input(tmp_path, tiny_dir, write_jsonl, capsys):
    """--pass-through with --retry-failed: an over-long row (its columns null: the record was not read) gets them
    once it is redone; the rows around it keep theirs."""
    src = write_jsonl([json.dumps({**json.loads(line), "ticket": i}) for i, line in enumerate(long_and_short(4))])
    out = tmp_path / "out"
    assert cli(argv(src, out, tiny_dir, "--pass-through", "ticket", "--max-record-bytes", "150"), capsys)[0] == 0
    first = by_row(out)
    assert [first[r]["ticket"] for r in range(4)] == [0, None, 2, None] and first[1]["error"] is not None
    code, _, err = cli(argv(src, out, tiny_dir, "--pass-through", "ticket", "--retry-failed", "--force"), capsys)
    assert code == 0, err
    redone = by_row(out)
    assert [redone[r]["ticket"] for r in range(4)] == [0, 1, 2, 3] and redone[1]["error"] is None
