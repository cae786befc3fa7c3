"""A record's generation parameters (spcli/io/params.py): read alike from plain records, Parquet and OpenAI bodies;
then through `spcli run` on the hf engine: each record's own settings applied, stored in its row's `sampling`
column, a seed that repeats on a rerun and on resume, and a parameter spcli does not apply made an error row naming
it and the engine.
The vLLM engine: tests/test_engines_vllm_sampling.py."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from spcli import api
from spcli.cli import app
from spcli.errors import Interrupted
from spcli.job.run import run
from test_io_read import one_error, records as read
from test_job_resume import StopAfter
from test_job_run import read_outputs

READ = {"top_p": 0.5, "top_k": 5, "min_p": 0.1, "stop": ["\n\n", "END"], "seed": 7, "presence_penalty": 0.5,
        "frequency_penalty": -0.5, "repetition_penalty": 1.2, "temperature": 0.8}


def test_sampling_fields_are_read_alike_from_plain_records_parquet_and_openai_bodies(tmp_path):
    """The issue: a plain record's top_p was accepted and ignored in silence, while an OpenAI body's was an error.
    Each of vLLM's applied SamplingParams is read, the same way, from all three; any other SamplingParams name
    that holds a value is kept to be refused by name (spcli.stages.prepare), never dropped."""
    plain = {"id": "p", "prompt": "x", **READ, "n": 2, "min_tokens": 3, "ignore_eos": False, "logprobs": None,
             "doc_id": "d1"}
    body = {"custom_id": "o", "url": "/v1/completions", "body": {"prompt": "x", **READ, "n": 1, "logprobs": True,
                                                                 "logit_bias": {"5": 1}, "min_tokens": 3}}
    (tmp_path / "in.jsonl").write_text(json.dumps(plain) + "\n" + json.dumps(body) + "\n")
    pq.write_table(pa.table({"id": ["q"], "prompt": ["x"], **{k: [v] for k, v in READ.items()},
                             "min_tokens": [3], "bad_words": pa.array([None], pa.list_(pa.string()))}),
                   tmp_path / "in.parquet")
    p, o = read(tmp_path / "in.jsonl")
    (q,) = read(tmp_path / "in.parquet")
    own = {k: (tuple(v) if k == "stop" else v) for k, v in READ.items() if k not in ("seed", "temperature")}
    for rec in (p, o, q):
        assert rec.error is None and rec.sampling == own and (rec.seed, rec.temperature) == (7, 0.8), rec
    assert p.unapplied == (("n", 2), ("min_tokens", 3)), "a no-op value (ignore_eos false) and null change nothing"
    assert o.unapplied == (("body.min_tokens", 3), ("body.logprobs", True), ("body.logit_bias", {"5": 1}))
    assert q.unapplied == (("min_tokens", 3),)


@pytest.mark.parametrize("field, value, problem", [
    ("top_p", 0, "must be in (0, 1], got 0"), ("top_k", -2, "must be -1, 0 (all tokens) or >= 1, got -2"),
    ("top_k", 2.5, "must be an integer, got 2.5"), ("min_p", 1.5, "must be in [0, 1], got 1.5"),
    ("presence_penalty", 3, "must be in [-2, 2], got 3"), ("repetition_penalty", 0, "must be > 0, got 0"),
    ("seed", -1, "must be in [0, 9223372036854775807], got -1"),
    ("stop", "", "must be a non-empty string or a list of them, got ''"),
    ("stop", [3], "must be a non-empty string or a list of them, got [3]"),
])
def test_a_bad_sampling_value_is_an_error_naming_file_line_and_field(tmp_path, field, value, problem):
    error = one_error(tmp_path, json.dumps({"prompt": "x", field: value}))
    assert error == f"{tmp_path}/one.jsonl:row 0 (line 1): field {field!r} {problem}"
    line = {"custom_id": "c", "body": {"messages": [{"role": "user", "content": "x"}], field: value}}
    assert one_error(tmp_path, json.dumps(line)) == f"{tmp_path}/one.jsonl:row 0 (line 1): field 'body.{field}' {problem}"


PROMPT = "The harbour authority reviewed the budget for next year and published a short note. " * 4
SAMPLED = {"temperature": 1.0, "seed": 5}
FLAGS = dict(keep=1.0, max_tokens=12, dtype="float32", batch_size=2, commit_interval=0.0)


def records() -> list[dict]:
    return [
        {"id": "plain", "prompt": PROMPT},
        {"id": "seed-a", "prompt": PROMPT, **SAMPLED},
        {"id": "seed-b", "prompt": PROMPT, **SAMPLED, "doc": "same seed, another id"},
        {"id": "top-k-1", "prompt": PROMPT, "temperature": 1.0, "top_k": 1},
        {"id": "unapplied", "prompt": PROMPT, "min_tokens": 3, "n": 1},
        {"id": "repeats", "prompt": PROMPT, "frequency_penalty": -2.0},
        {"id": "best-of", "prompt": PROMPT, "best_of": 2, "user": "u1"},  # an OpenAI name: refused, not data
    ]


def spcli_run(src, out, tiny_dir, *extra) -> dict[str, dict]:
    argv = ["run", str(src), "--out", str(out), "--model", str(tiny_dir), "--keep", "1.0", "--max-tokens", "12",
            "--dtype", "float32", "--batch-size", "2", "--commit-interval", "0", *extra]
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 0, (res.output, res.exception)
    return {r["id"]: r for r in read_outputs(out)}


@pytest.fixture(scope="module")
def rows(tmp_path_factory, tiny_dir) -> dict[str, dict]:
    src = tmp_path_factory.mktemp("params") / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records()))
    return spcli_run(src, src.parent / "out", tiny_dir)


def test_each_record_s_own_settings_are_applied_and_stored_in_its_row(rows):
    plain = rows["plain"]
    assert plain["sampling"] is None, "greedy without settings: the column stays null"
    assert rows["seed-a"]["output"] == rows["seed-b"]["output"] != plain["output"], "a record's seed, whatever its id"
    assert rows["seed-a"]["sampling"]["seed"] == 5 and rows["seed-a"]["sampling"]["temperature"] == 1.0
    assert rows["top-k-1"]["output"] == plain["output"], "top_k 1 is greedy"
    assert rows["top-k-1"]["sampling"]["top_k"] == 1 and rows["top-k-1"]["sampling"]["seed"] > 0, "its derived seed"
    assert rows["repeats"]["output"] != plain["output"] and rows["repeats"]["sampling"]["frequency_penalty"] == -2.0
    error = rows["unapplied"]["error"]
    assert error.endswith("in.jsonl:row 4 (line 5): field 'min_tokens' (3) is a generation parameter --engine hf does not "
                          "apply (it applies temperature, max_tokens, seed, top_p, top_k, min_p, presence_penalty, "
                          "frequency_penalty, repetition_penalty, stop); remove it from the record"), error
    assert rows["unapplied"]["output"] is None
    best_of = rows["best-of"]["error"]  # issue 59: it was read as data and ignored
    assert best_of.endswith("in.jsonl:row 6 (line 7): field 'best_of' (2; one output per record) is a generation parameter "
                            "--engine hf does not apply (it applies temperature, max_tokens, seed, top_p, top_k, min_p, "
                            "presence_penalty, frequency_penalty, repetition_penalty, stop); remove it from the record")


def test_parquet_columns_and_a_stop_string(rows, tiny_dir, tmp_path):
    """The same settings as Parquet columns; a stop string ends the output before it (finish_reason stop)."""
    text = rows["plain"]["output"]
    stop = text.split()[2]
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": ["seed-a", "stopped"], "prompt": [PROMPT, PROMPT], "temperature": [1.0, None],
                             "seed": pa.array([5, None], pa.int64()), "stop": [None, [stop]]}), src)
    got = spcli_run(src, tmp_path / "out", tiny_dir)
    assert got["seed-a"]["output"] == rows["seed-a"]["output"]
    assert got["stopped"]["output"] == text[: text.find(stop)] and got["stopped"]["finish_reason"] == "stop"
    assert got["stopped"]["sampling"]["stop"] == [stop]


def test_a_seeded_job_samples_the_same_on_a_rerun_and_on_resume(tiny_dir, tmp_path, write_jsonl):
    src = write_jsonl([{"id": f"r{i}", "prompt": PROMPT[: 80 + 20 * i]} for i in range(4)])
    flags = dict(FLAGS, temperature=0.9, top_p=0.9, seed=42, model=str(tiny_dir))
    whole = tmp_path / "whole"
    api.run([src], whole, **flags)
    with pytest.raises(Interrupted):
        run(api.run_config([src], tmp_path / "resumed", **flags), StopAfter(1))
    assert len(read_outputs(tmp_path / "resumed")) == 2
    api.run([src], tmp_path / "resumed", **flags)
    key = lambda out: {r["id"]: (r["output"], r["sampling"]) for r in read_outputs(out)}
    assert key(tmp_path / "resumed") == key(whole), "two runs, one of them resumed: the same samples"
    assert len({v[0] for v in key(whole).values()}) == 4 and all(v[1]["top_p"] == 0.9 for v in key(whole).values())
