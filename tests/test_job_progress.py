"""Progress of a run: plain lines off a terminal, a bar on one, one INFO line per batch, --log-json."""

from __future__ import annotations

import io
import json
import logging
import re

import pytest
from typer.testing import CliRunner

from spcli.cli import app
from spcli.errors import ConfigError
from spcli.io.schema import RowResult
from spcli.job.progress import JsonFormatter, Progress, batch_line, setup_logging


def batch(num_rows: int = 4, failed: int = 1) -> list[RowResult]:
    rows = [RowResult(f"r{i}", "in.jsonl", i, output="x", num_prompt_tokens=100, num_kept_tokens=25,
                      speculate_s=0.5, prefill_s=0.75) for i in range(num_rows - failed)]
    return rows + [RowResult(f"e{i}", "in.jsonl", 99, error="bad") for i in range(failed)]


@pytest.fixture(autouse=True)
def restore_logging():
    root, spcli = logging.getLogger(), logging.getLogger("spcli")
    handlers, level, spcli_level = list(root.handlers), root.level, spcli.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    spcli.setLevel(spcli_level)


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_batch_line():
    msg, fields = batch_line(batch())
    assert msg == "scored 300 tokens, kept 75 (25.0%), speculator 1.5 s, base 0.8 s; 4 rows, 1 failed"
    assert fields == {"event": "batch", "rows": 4, "failed": 1, "prompt_tokens": 300, "kept_tokens": 75, "kept_pct": 25.0,
                      "speculate_s": 1.5, "prefill_s": 0.75}
    assert batch_line(batch(1, 0))[0].endswith("; 1 row")


def test_plain_lines_when_not_a_terminal(caplog):
    caplog.set_level(logging.INFO, logger="spcli")
    stream = io.StringIO()
    p = Progress(stream=stream, interval_s=3600)
    p.start(total=12)
    p.update(batch())  # the first batch prints at once, later ones every interval_s
    p.update(batch())
    p.close()  # and the final numbers
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert re.fullmatch(r"progress: 4/12 rows, [\d.]+ rows/s, \d+ prompt tok/s, kept 25\.0%, failed 1, ETA \w+", lines[0])
    assert re.fullmatch(r"progress: 8/12 rows, [\d.]+ rows/s, \d+ prompt tok/s, kept 25\.0%, failed 2, ETA \w+", lines[1])
    batches = [r.getMessage() for r in caplog.records if r.getMessage().startswith("scored")]
    assert batches == ["scored 300 tokens, kept 75 (25.0%), speculator 1.5 s, base 0.8 s; 4 rows, 1 failed"] * 2


def test_unknown_total_and_quiet():
    stream = io.StringIO()
    p = Progress(stream=stream, interval_s=0)
    p.start(total=None)
    p.update(batch(2, 0))
    assert re.match(r"progress: 2 rows, .*kept 25\.0%, failed 0$", stream.getvalue().strip())
    quiet = io.StringIO()
    q = Progress(stream=quiet, interval_s=0, quiet=True)
    q.start(total=5)
    q.update(batch())
    q.close()
    assert quiet.getvalue() == ""


def test_bar_on_a_terminal():
    stream = Tty()
    p = Progress(stream=stream)
    p.start(total=8)
    p.update(batch())
    p.close()
    out = stream.getvalue()
    assert "progress:" not in out
    assert re.search(r"4/8 \[.*row.*tok/s, kept 25\.0%, failed 1\]", out), out


def test_json_lines(capsys):
    setup_logging("INFO", quiet=False, json_lines=True)
    p = Progress(stream=Tty(), interval_s=0)  # no bar with --log-json, even on a terminal
    p.start(total=4)
    p.update(batch())
    p.close()
    docs = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [d["event"] for d in docs] == ["batch", "failed_row", "progress"]
    assert docs[0]["message"].startswith("scored 300 tokens") and docs[0]["kept_tokens"] == 75
    failed = docs.pop(1)
    assert (failed["level"], failed["message"]) == ("WARNING", f"failed row {failed['id']!r}: {failed['error']}")
    assert docs[1]["rows"] == 4 and docs[1]["total"] == 4 and docs[1]["failed"] == 1 and docs[1]["kept_pct"] == 25.0
    assert docs[1]["level"] == "INFO" and docs[1]["logger"] == "spcli" and "time" in docs[1]


def test_json_formatter_keeps_exceptions():
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("spcli", logging.ERROR, __file__, 1, "failed %s", ("x",), exc_info=True)
        import sys

        record.exc_info = sys.exc_info()
    doc = json.loads(JsonFormatter().format(record))
    assert doc["message"] == "failed x" and "ValueError: boom" in doc["exception"]


def test_log_options_through_the_cli():
    res = CliRunner().invoke(app, ["--log-level", "loud", "models"])
    assert isinstance(res.exception, ConfigError) and "--log-level must be one of DEBUG, INFO, WARNING, ERROR" in str(res.exception)
    setup_logging("debug")
    assert logging.getLogger("spcli").level == logging.DEBUG
    setup_logging("debug", quiet=True)
    assert logging.getLogger("spcli").level == logging.WARNING


def test_global_flags_after_the_subcommand_move_before_it():
    """The issue: `spcli run ... -q` was "No such option" (only `spcli -q run` worked); -v is --log-level DEBUG."""
    from spcli.cli import hoist_global_flags

    assert hoist_global_flags(["run", "a.jsonl", "--out", "o", "-q"]) == ["-q", "run", "a.jsonl", "--out", "o"]
    assert hoist_global_flags(["inspect", "o", "-v", "--log-level", "INFO", "--width", "80"]) == [
        "-v", "--log-level", "INFO", "inspect", "o", "--width", "80"]
    assert hoist_global_flags(["slurm", "submit", "x", "--debug", "--", "--engine", "vllm", "-q"]) == [
        "--debug", "slurm", "submit", "x", "--", "--engine", "vllm", "-q"], "what follows -- is spcli run's"
    assert hoist_global_flags(["--version"]) == ["--version"]
    res = CliRunner().invoke(app, ["-v", "models"])
    assert res.exit_code == 0 and logging.getLogger("spcli").level == logging.DEBUG
    setup_logging("INFO")
