"""`--keep auto` end to end on the tiny model: chosen rates in the rows, a record's own keep, resume's
fingerprint, OpenAI batch `body.keep`, the Slurm submit check and `spcli inspect`'s distribution."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from spcli.cli import app
from spcli.config.scoring import SelectConfig
from spcli.stages.select import auto_budget
from test_bad_input import cli, last_line
from test_job_resume import argv
from test_job_run import read_outputs

AUTO = ["--keep", "auto", "--keep-scale", "0.6", "--keep-min", "0.1", "--keep-max", "0.8"]


def rows(k: int) -> list[dict]:
    return [{"id": f"r{i}", "prompt": " ".join(f"topic{(i * 5 + j * j) % 37}" for j in range(60 + 20 * i))} for i in range(k)]


def test_keep_auto_rows_show_the_budget_chosen_from_each_prompts_importance(tmp_path, tiny_dir, write_jsonl):
    src = write_jsonl(rows(4) + [{"id": "own", "prompt": "fixed rate here " * 30, "keep": 0.25}])
    out = tmp_path / "out"
    res = CliRunner().invoke(app, argv(src, out, tiny_dir, *AUTO, "--save-scores", "--pool", "1"))
    assert res.exit_code == 0, res.output  # pool 1: the saved scores are the unpooled ones the budget reads
    cfg = SelectConfig(keep="auto", chunk=8, keep_last=8, min_tokens=16, keep_scale=0.6, keep_min=0.1, keep_max=0.8)
    got = {r["id"]: r for r in read_outputs(out)}
    for i in range(4):
        r = got[f"r{i}"]
        n = r["num_prompt_tokens"]
        want = auto_budget(torch.tensor(r["importance"], dtype=torch.float32), cfg)
        assert r["num_kept_tokens"] == len(r["kept_indices"]) == want
        assert math.ceil(0.1 * n) <= want <= math.ceil(0.8 * n)
        assert r["keep_rate"] == pytest.approx(want / n)
    own = got["own"]
    assert own["num_kept_tokens"] == math.ceil(0.25 * own["num_prompt_tokens"]), "a record's own keep wins"
    select = json.loads((out / "manifest.json").read_text())["fingerprint_fields"]["select"]
    assert (select["keep"], select["keep_scale"], select["keep_min"], select["keep_max"]) == ("auto", 0.6, 0.1, 0.8)


def test_a_records_auto_wins_over_a_fixed_keep(tmp_path, tiny_dir, write_jsonl):
    src = write_jsonl([{"id": "a", "prompt": "same words again " * 40, "keep": "auto"},
                       {"id": "f", "prompt": "same words again " * 40}])
    out = tmp_path / "out"
    res = CliRunner().invoke(app, argv(src, out, tiny_dir, "--keep", "1.0", "--keep-min", "0.2", "--keep-max", "0.2"))
    assert res.exit_code == 0, res.output
    got = {r["id"]: r for r in read_outputs(out)}
    n = got["a"]["num_prompt_tokens"]
    assert got["a"]["num_kept_tokens"] == math.ceil(0.2 * n)  # keep_min = keep_max pins auto's budget
    assert got["f"]["num_kept_tokens"] == n


def test_changed_keep_scale_refuses_to_resume(tmp_path, tiny_dir, write_jsonl, capsys):
    src = write_jsonl(rows(2))
    out = tmp_path / "out"
    code, _, err = cli(argv(src, out, tiny_dir, *AUTO), capsys)
    assert code == 0, err
    code, stdout, err = cli(argv(src, out, tiny_dir, *AUTO), capsys)
    assert code == 0 and stdout.startswith("nothing to do: 2 rows already done"), err
    code, _, err = cli(argv(src, out, tiny_dir, *AUTO, "--keep-scale", "0.8"), capsys)
    assert code == 2
    assert last_line(err) == (f"spcli: error: {out} holds a run with another configuration (select.keep_scale: 0.6 -> 0.8); "
                              "rerun with --fresh to start over (deletes its outputs) or --force to append anyway")


def test_openai_batch_body_keep_auto(tmp_path, tiny_dir, write_jsonl, capsys):
    text = "Notes on the quarterly review of the northern office and its many budget lines. " * 6
    src = write_jsonl([{"custom_id": "auto-1", "method": "POST", "url": "/v1/chat/completions",
                        "body": {"messages": [{"role": "user", "content": text}], "keep": "auto"}},
                       {"custom_id": "bad", "method": "POST", "url": "/v1/completions", "body": {"prompt": text, "keep": "most"}}],
                      "batch.jsonl")
    out = tmp_path / "out"
    code, _, err = cli(argv(src, out, tiny_dir, "--keep", "1.0", "--keep-min", "0.3", "--keep-max", "0.3",
                            "--output-format", "openai"), capsys)
    assert code == 0, err
    side = {r["custom_id"]: r for r in read_outputs(out)}
    n = side["auto-1"]["num_prompt_tokens"]
    assert side["auto-1"]["num_kept_tokens"] == math.ceil(0.3 * n) < n
    assert side["bad"]["error"].endswith("field 'keep' must be a number in (0, 1] or \"auto\", got 'most'")


def test_slurm_submit_passes_keep_auto_through(tmp_path, write_jsonl):
    src = write_jsonl([{"id": "x", "prompt": "hello"}])
    res = CliRunner().invoke(app, ["slurm", "submit", str(src), "--out", str(tmp_path / "out"), "--dry-run", "--",
                                   "--keep", "auto", "--keep-scale", "0.8", "--keep-max", "0.4"])
    assert res.exit_code == 0, res.output
    assert "run --keep auto --keep-scale 0.8 --keep-max 0.4" in res.stdout.replace(f"{src} --out {tmp_path / 'out'} ", "")


def test_inspect_shows_auto_settings_and_the_chosen_rates(tmp_path, tiny_dir, write_jsonl):
    from spcli.inspect.outputs import load_run
    from spcli.inspect.summary import summarize

    src = write_jsonl(rows(3))
    out = tmp_path / "out"
    res = CliRunner().invoke(app, argv(src, out, tiny_dir, *AUTO))
    assert res.exit_code == 0, res.output
    s = summarize(load_run(out))
    assert (s.config["keep"], s.config["keep_scale"], s.config["keep_min"], s.config["keep_max"]) == ("auto", 0.6, 0.1, 0.8)
    rates = sorted(r["keep_rate"] for r in read_outputs(out))
    assert s.keep_quantiles["min"] == pytest.approx(rates[0]) and s.keep_quantiles["max"] == pytest.approx(rates[-1])
    shown = CliRunner().invoke(app, ["inspect", str(out)])
    assert shown.exit_code == 0, shown.output
    assert "keep auto" in shown.output and "keep_scale 0.6" in shown.output
