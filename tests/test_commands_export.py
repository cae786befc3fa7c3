"""`spcli export` and `spcli inspect --answers` (spcli/commands/export.py, spcli/inspect/answers.py, export.py), and
load_run's pass-through columns (spcli/inspect/outputs.py), through the CLI runner on the examples' tickets."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from spcli import api
from spcli.cli import app
from spcli.errors import Interrupted
from spcli.inspect.outputs import load_run
from spcli.job.run import run
from test_job_resume import StopAfter

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TICKETS = dict(prompt_field="body", id_field="ticket_id", instruction_field="question", pass_through="answer",
               keep=1.0, max_tokens=4, dtype="float32", batch_size=2, commit_interval=0.0)


@pytest.fixture(scope="module")
def tickets(tmp_path_factory, tiny_dir) -> Path:
    """examples/tickets.parquet through spcli run, finished: six support threads, `answer` passed through."""
    out = tmp_path_factory.mktemp("export") / "tickets"
    api.run([EXAMPLES / "tickets.parquet"], out, model=str(tiny_dir), **TICKETS)
    return out


def spcli(*argv: str):
    res = CliRunner().invoke(app, list(argv))
    assert res.exit_code == 0, (res.output, res.exception)
    return res


def test_load_run_rows_and_table_carry_the_pass_through_columns(tickets):
    """The issue: rows() gave the standard columns but not the --pass-through column the parts hold."""
    source = pq.read_table(EXAMPLES / "tickets.parquet").to_pylist()
    run_ = load_run(tickets)
    assert run_.pass_through == ["answer"]
    rows = list(run_.rows())
    assert [(r["id"], r["answer"]) for r in rows] == [(t["ticket_id"], t["answer"]) for t in source]
    assert rows[0].keys() >= {"id", "output", "kept_indices", "sampling", "answer"}
    assert run_.table(["id", "answer"]).column("answer").to_pylist() == [t["answer"] for t in source]


def test_export_csv_round_trips_the_rows_with_pass_through_and_input_columns(tickets, tmp_path):
    source = pq.read_table(EXAMPLES / "tickets.parquet").to_pylist()
    to = tmp_path / "answers.csv"
    res = spcli("export", str(tickets), "--join-input", "--to", str(to))
    assert res.stdout == f"wrote 6 rows of {tickets} to {to} (csv); the run is finished\n"
    with open(to, newline="") as f:
        table = list(csv.DictReader(f))
    assert list(table[0]) == ["id", "output", "finish_reason", "error", "answer", "ticket_id", "question"], \
        "the output columns, the pass-through ones, the input's but its document (body) and the pass-through answer"
    rows = list(load_run(tickets).rows())
    assert [r["id"] for r in table] == [t["ticket_id"] for t in source], "input order"
    for got, row, t in zip(table, rows, source):
        assert (got["output"], got["finish_reason"], got["error"]) == (row["output"], row["finish_reason"], "")
        assert (got["answer"], got["ticket_id"], got["question"]) == (t["answer"], t["ticket_id"], t["question"])

    res = spcli("export", str(tickets), "--columns", "id,keep_rate,kept_indices", "--input-columns", "body",
                "--format", "jsonl")
    lines = [json.loads(x) for x in res.stdout.splitlines()]
    assert list(lines[0]) == ["id", "keep_rate", "kept_indices", "answer", "body"] and len(lines) == 6
    assert lines[0]["body"] == source[0]["body"] and lines[0]["kept_indices"] == rows[0]["kept_indices"]
    assert res.stderr == f"spcli: exported 6 rows of {tickets}; the run is finished\n"


def test_export_of_a_partial_run_writes_the_committed_rows_and_says_how_many_are_pending(tiny_dir, tmp_path):
    out = tmp_path / "partial"
    with pytest.raises(Interrupted):
        run(api.run_config([EXAMPLES / "tickets.parquet"], out, model=str(tiny_dir), **TICKETS), StopAfter(1))
    res = spcli("export", str(out), "--join-input")
    table = list(csv.DictReader(io.StringIO(res.stdout)))
    assert [r["ticket_id"] for r in table] == ["T-1040", "T-1041"] and all(r["output"] for r in table)
    assert res.stderr == (f"spcli: exported 2 rows of {out}; 4 rows pending: not committed yet (run the same "
                          "`spcli run` again to finish them)\n")
    res = spcli("inspect", str(out), "--answers", "-n", "1", "--width", "400")  # the header names the long tmp path
    assert f"{out}: the first 1 of 2 committed rows, 4 pending" in res.stdout and "T-1040" in res.stdout
    assert "T-1041" not in res.stdout and "answer" in res.stdout and "1 more (use -n, or spcli export)" in res.stdout


def test_chat_examples_join_their_other_fields_and_name_their_messages_on_request(tiny_dir, tmp_path):
    out = tmp_path / "docs"
    api.run([EXAMPLES / "docs.jsonl"], out, model=str(tiny_dir), keep=1.0, max_tokens=2, dtype="float32")
    res = spcli("export", str(out), "--join-input", "--format", "jsonl")
    lines = [json.loads(x) for x in res.stdout.splitlines()]
    assert [list(x) for x in lines] == [["id", "output", "finish_reason", "error", "answer"]] * 4, \
        "docs.jsonl's fields but its id (the output's) and messages (the document)"
    assert lines[0]["answer"] == json.loads((EXAMPLES / "docs.jsonl").read_text().splitlines()[0])["answer"]
    res = spcli("export", str(out), "--input-columns", "messages,id", "--columns", "id")
    first = next(csv.DictReader(io.StringIO(res.stdout)))
    assert json.loads(first["messages"])[0]["role"] == "user" and first["input.id"] == first["id"] == "doc-0"


@pytest.mark.parametrize("argv, message", [
    (["--columns", "id,answers"], "--columns answers: no such column in {out}; its columns: id, shard, row, output"),
    (["--format", "parquet"], "--format parquet writes a file: give --to FILE"),
    (["--format", "xlsx"], "--format must be one of csv, jsonl, parquet, got 'xlsx'"),
    (["--input-columns", "nope"], "--input-columns nope: no input record of {out} has such a field"),
])
def test_bad_export_options_are_clear_errors(tickets, argv, message, capsys):
    from test_bad_input import cli

    code, _, err = cli(["export", str(tickets), *argv], capsys)
    assert code == 2 and err.startswith("spcli: error: " + message.format(out=tickets)), err
