"""spcli.api: the Python entry points build the CLI's RunConfig and run the CLI's job (tiny random model)."""

from __future__ import annotations

from tiny_models import ALWAYS_PRUNE
import inspect
import json

import pytest
from typer.testing import CliRunner

from spcli import api, cli
from spcli.errors import ConfigError
from spcli.inspect.outputs import load_run

FLAGS = dict(keep=0.3, min_tokens=16, max_prune_cost=float("inf"), keep_last=8, chunk=8, max_tokens=5, dtype="float32", lookahead=2,
             speculator="self:2")
CLI_FLAGS = ["--keep", "0.3", "--min-tokens", "16", *ALWAYS_PRUNE, "--keep-last", "8", "--chunk", "8", "--max-tokens", "5",
             "--dtype", "float32", "--lookahead", "2", "--speculator", "self:2"]


def records(k: int) -> list[dict]:
    return [{"id": f"r{i}", "prompt": " ".join(f"word{(i * 7 + j) % 50}" for j in range(60 + 13 * i))} for i in range(k)]


def test_every_run_option_is_an_api_keyword_and_back():
    params = set(inspect.signature(cli.run).parameters) - {"inputs", "out", "fail_on_error"}  # the last: an exit
    # code, the command line's; api.run returns the RunSummary, whose `failed` says the same
    assert params == set(api.FLAGS), (params ^ set(api.FLAGS))


def test_api_run_is_what_the_cli_runs(tmp_path, tiny_dir, write_jsonl):
    jl = write_jsonl(records(3))
    res = CliRunner().invoke(cli.app, ["run", str(jl), "--out", str(tmp_path / "cli"), "--model", str(tiny_dir),
                                       "--prompt-field", "prompt", *CLI_FLAGS])
    assert res.exit_code == 0, res.output
    summary = api.run([jl], tmp_path / "api", model=str(tiny_dir), prompt_field="prompt", **FLAGS)
    assert (summary.rows, summary.failed) == (3, 0)
    a, b = load_run(tmp_path / "cli"), load_run(tmp_path / "api")
    assert inspect.isgenerator(a.rows()) and len(list(a.rows())) == 3, "an iterator, as docs/guide/python.md says"
    assert {**a.config, "out": None} == {**b.config, "out": None}
    assert a.fingerprint_fields == b.fingerprint_fields
    strip = ("ttft_s", "speculate_s", "prefill_s", "decode_s")
    assert [{k: v for k, v in r.items() if k not in strip} for r in a.rows()] == \
        [{k: v for k, v in r.items() if k not in strip} for r in b.rows()]


def test_prefill_returns_one_row_per_record_in_order(tiny_dir):
    recs = records(4)
    recs[2] = {"id": "bad", "text": "no prompt field here"}
    recs.append({"prompt": "short prompt without an id"})
    rows = api.prefill(recs, model=str(tiny_dir), batch_size=2, **FLAGS)
    assert [r["id"] for r in rows] == ["r0", "r1", "bad", "r3", "records:4"]
    assert rows[2]["error"] and "prompt" in rows[2]["error"] and rows[2]["output"] is None
    for r in rows[:2] + rows[3:4]:
        assert r["error"] is None and isinstance(r["output"], str)
        assert r["num_kept_tokens"] < r["num_prompt_tokens"]  # pruned at keep 0.3
        assert r["kept_indices"] == sorted(r["kept_indices"])
    assert rows[4]["num_kept_tokens"] == rows[4]["num_prompt_tokens"]  # under --min-tokens: not pruned
    assert "importance" not in rows[0]
    scored = api.prefill(recs[:1], model=str(tiny_dir), save_scores=True, **FLAGS)
    assert len(scored[0]["importance"]) == scored[0]["num_prompt_tokens"]


def test_unknown_keyword_is_refused_with_the_closest_flag():
    with pytest.raises(ConfigError, match=r"keeep \(did you mean keep\?\)"):
        api.run_config(["x.jsonl"], "out", keeep=0.1)
    with pytest.raises(ConfigError, match="prefill takes no out"):
        api.prefill([{"prompt": "x"}], out="somewhere")


def test_flags_land_where_the_cli_puts_them():
    cfg = api.run_config("x.jsonl", "o", keep="auto", prompt_field="body", id_field="ticket", score_impl="torch",
                         tp=8, max_tokens=7, score_layers="14", speculator=None)
    assert cfg.inputs == ("x.jsonl",) and cfg.out == "o"
    assert (cfg.select.keep, cfg.fields.prompt, cfg.fields.id, cfg.score.impl) == ("auto", "body", "ticket", "torch")
    assert (cfg.vllm.tp, cfg.generate.max_tokens, cfg.score.score_layers, cfg.speculator) == (8, 7, "14", None)
    with pytest.raises(ConfigError, match="--keep must be in"):
        api.run_config("x.jsonl", "o", keep=1.5)


def test_prefill_of_nothing_is_nothing():
    assert api.prefill([]) == []
    with pytest.raises(ConfigError, match="record 0"):
        api.prefill([json.dumps({"prompt": "a string, not a dict"})])


def test_prefill_brings_back_pass_through_columns(tiny_dir):
    recs = [{**r, "queue": f"q{i}", "priority": i} for i, r in enumerate(records(2))]
    rows = api.prefill(recs, model=str(tiny_dir), pass_through="queue,priority", **FLAGS)
    assert [(r["id"], r["queue"], r["priority"]) for r in rows] == [("r0", "q0", 0), ("r1", "q1", 1)]
