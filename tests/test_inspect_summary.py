"""`spcli inspect DIR`: the run summary, computed from a known output directory.

`write_run` builds an output directory without a model (parts and manifest written as `spcli run`
writes them), so every number in it is known; the other inspect tests import it.
"""

from __future__ import annotations

from tiny_models import ALWAYS_PRUNE
import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from spcli.models import profiles
from spcli.cli import app
from spcli.config.run import RunConfig
from spcli.config.scoring import PAPER_SCORE, SelectConfig
from spcli.errors import OutputError
from spcli.io import commit
from spcli.io.manifest import Manifest, ShardProgress, input_identity
from spcli.io.shards import Shard
from spcli.io.schema import RowResult, to_dict, to_table


def write_run(out: Path, model_dir: Path, records: list[dict], results: list[dict], select: SelectConfig,
              save_scores: bool = False, extra_lines: int = 0, fmt: str = "parquet", rows_per_part: int = 2) -> Path:
    """An output directory for `records` (written as the input shard), one committed row per entry of
    `results` (RowResult fields; id/shard/row filled in). extra_lines: input rows not yet committed."""
    out.mkdir(parents=True, exist_ok=True)
    shard = out.parent / f"{out.name}-input.jsonl"
    with open(shard, "w") as f:
        for r in records + [{"id": f"pending{i}", "prompt": "later"} for i in range(extra_lines)]:
            f.write(json.dumps(r) + "\n")
    rows = [RowResult(**{"id": rec["id"], "shard": str(shard), "row": i, **res}) for i, (rec, res) in enumerate(zip(records, results))]
    cfg = RunConfig(inputs=(str(shard),), out=str(out), model=str(model_dir), speculator="self:2", dtype="float32",
                    save_scores=save_scores, select=select, output_format=fmt)
    cfg = profiles.resolve(cfg, cfg.model, model_dir, "self:2")  # as spcli run stores it
    prog = ShardProgress(str(shard), next_row=len(rows), rows=len(rows), failed=sum(r.error is not None for r in rows),
                         prompt_tokens=sum(r.num_prompt_tokens for r in rows), kept_tokens=sum(r.num_kept_tokens for r in rows),
                         total_rows=len(rows) if extra_lines == 0 else None, done=extra_lines == 0)
    for start in range(0, len(rows), rows_per_part):
        name = commit.part_name(0, len(prog.parts), fmt)
        batch = rows[start : start + rows_per_part]
        prog.prefill_s += commit.batch_prefill_s(batch)
        if fmt == "parquet":
            pq.write_table(to_table(batch, save_scores), out / name)
        else:
            (out / name).write_text("".join(json.dumps(to_dict(r, save_scores)) + "\n" for r in batch))
        prog.parts.append(name)
    fields = {**cfg.fingerprint_fields(), "model_path": str(model_dir),
              "inputs": [{k: v for k, v in s.items() if k != "index"} for s in input_identity([Shard(0, str(shard))])]}
    m = Manifest(out / "manifest.json", cfg.to_dict(), fields, {0: prog}, wall_s=12.5, finished=extra_lines == 0)
    m.save()
    return out


def ok_row(n: int, kept: list[int], ttft: float, output: str = "out", importance: list[float] | None = None) -> dict:
    return dict(output=output, finish_reason="length", num_prompt_tokens=n, num_kept_tokens=len(kept), num_output_tokens=3,
                kept_indices=kept, ttft_s=ttft, speculate_s=0.5, prefill_s=0.25, decode_s=0.1, importance=importance)


@pytest.fixture()
def known_run(tmp_path, tiny_dir):
    """4 ok rows (keep 10%, 20%, 30%, 100%; TTFT 1..4 s), 2 errors with one message, 3 input rows pending."""
    records = [{"id": f"r{i}", "prompt": "x"} for i in range(6)]
    results = [
        ok_row(100, list(range(10)), 1.0), ok_row(100, list(range(20)), 2.0),
        ok_row(200, list(range(60)), 3.0), ok_row(50, list(range(50)), 4.0),
        dict(error="/data/in.jsonl:row 4 (line 5): field 'prompt' must be a string, got int"),  # since issue 59
        dict(error="/data/in.jsonl:line 6: field 'prompt' must be a string, got int"),  # before: the same message
    ]
    return write_run(tmp_path / "out", tiny_dir, records, results, SelectConfig(keep=0.2, chunk=8), extra_lines=3)


def test_summary_numbers(known_run):
    from spcli.inspect.outputs import load_run
    from spcli.inspect.summary import summarize

    s = summarize(load_run(known_run))
    assert (s.num_rows, s.num_failed, s.num_pending, s.is_finished) == (6, 2, 3, False)
    assert (s.num_shards, s.num_shards_done) == (1, 0)
    assert (s.num_prompt_tokens, s.num_kept_tokens, s.num_saved_tokens) == (450, 140, 310)
    assert s.saved_fraction == pytest.approx(310 / 450)
    assert s.keep_mean == pytest.approx((0.1 + 0.2 + 0.3 + 1.0) / 4)
    assert s.keep_quantiles["min"] == pytest.approx(0.1) and s.keep_quantiles["max"] == pytest.approx(1.0)
    assert s.keep_quantiles["p50"] == pytest.approx(0.25)
    assert s.keep_histogram == [0, 1, 1, 1, 0, 0, 0, 0, 0, 1]  # 10%, 20%, 30%, 100% (the last bin is closed)
    assert s.ttft_quantiles["p50"] == pytest.approx(2.5) and s.ttft_quantiles["max"] == pytest.approx(4.0)
    assert s.ttft_quantiles["p90"] == pytest.approx(3.7)
    assert s.speculate_s == pytest.approx(2.0) and s.wall_s == pytest.approx(12.5)
    assert s.config["keep"] == 0.2 and s.config["chunk"] == 8 and s.config["speculator"] == "self:2"
    assert s.config["lookahead"] == 0 and s.config["pool"] == PAPER_SCORE["pool"]  # resolved (self:K's fallback)
    assert len(s.errors) == 1
    assert (s.errors[0].message, s.errors[0].count) == ("field 'prompt' must be a string, got int", 2)
    assert s.errors[0].example.startswith("/data/in.jsonl:row 4 (line 5):")


def test_summary_labels_keep_rates_and_weighs_the_speculator_against_what_it_saved(known_run):
    res = CliRunner().invoke(app, ["inspect", str(known_run), "--width", "300"])
    assert res.exit_code == 0, res.output
    lines = [line.rstrip() for line in res.output.splitlines()]
    # 4 ok rows: speculator 0.5 s each; base prefill 0.25 s per batch of 2 rows -> 0.5 s for 140 kept tokens
    assert ("tokens     450 prompt -> 140 kept: prefill work saved 310 tokens (68.9%), at the cost of speculator 2.0 s "
            "(16.0% of wall time)") in lines
    assert ("           base prefill 0.5 s against about 1.6 s for a full prefill (estimated: this run's base prefill x "
            "prompt / kept tokens): about 1.1 s saved, for 2.0 s of speculation; the speculator cost more than it "
            "saved") in lines, res.output
    assert ("           an estimate, linear in tokens: fixed costs per batch make a full prefill cheaper, attention's "
            "quadratic cost dearer; --baseline DIR (a keep 1.0 run of these rows) measures it") in lines
    assert "keep rate  by tokens 31.1% (kept / prompt tokens over all rows)" in lines
    assert "           by rows: mean 40.0%, min 10.0%, p10 13.0%, p50 25.0%, p90 79.0%, max 100.0%" in lines
    assert ("time       wall 12.5 s, 36 prompt tokens/s, 1.0 output tokens/s (12 generated); speculator 2.0 s, "
            "base prefill 0.5 s (summed over batches, each once)") in lines
    assert any(line.startswith("config     model ") and ", speculator self:2, engine hf" in line for line in lines)


def test_prefill_time_of_an_older_manifest_is_labelled_an_estimate(known_run):
    doc = json.loads((known_run / "manifest.json").read_text())
    del doc["shards"]["0"]["prefill_s"]  # written before the manifest counted it per batch
    (known_run / "manifest.json").write_text(json.dumps(doc))
    res = CliRunner().invoke(app, ["inspect", str(known_run), "--width", "200"])
    assert ("time       wall 12.5 s, 36 prompt tokens/s, 1.0 output tokens/s (12 generated); speculator 2.0 s, "
            "base prefill 0.5 s (estimated from the rows: each row holds its batch's time)") in [l.rstrip() for l in res.output.splitlines()]


def test_speculator_is_shown_by_its_resolved_name(tmp_path, tiny_dir):
    from spcli.inspect.summary import resolved_config

    assert resolved_config({"model": "llama-8b", "speculator": None})["speculator"] == "llama-1b"
    assert resolved_config({"model": str(tiny_dir), "speculator": None}, {"speculator": "self:4"})["speculator"] == "self:4"


def test_summary_command(known_run):
    res = CliRunner().invoke(app, ["inspect", str(known_run), "--width", "120"])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "rows       6 done, 2 failed, 3 pending (shards 0/1 done)" in out
    assert "450 prompt -> 140 kept: prefill work saved 310 tokens (68.9%)" in out
    assert "mean 40.0%, min 10.0%, p10 13.0%, p50 25.0%, p90 79.0%, max 100.0%" in out
    assert "p50 2.500 s, p90 3.700 s, p99 3.970 s, max 4.000 s" in out
    assert "keep 0.2" in out and "chunk 8" in out and "pool 13" in out
    assert "2 x field 'prompt' must be a string, got int" in out
    assert "not finished" in out


def test_jsonl_parts_read_the_same(tmp_path, tiny_dir):
    from spcli.inspect.outputs import load_run
    from spcli.inspect.summary import summarize

    records = [{"id": "a", "prompt": "x"}, {"id": "b", "prompt": "y"}, {"id": "c", "prompt": "z"}]
    results = [ok_row(10, [0, 1], 1.0), ok_row(10, list(range(10)), 2.0), dict(error="boom")]
    run = load_run(write_run(tmp_path / "o", tiny_dir, records, results, SelectConfig(chunk=32), fmt="jsonl"))
    s = summarize(run)
    assert (s.num_rows, s.num_failed, s.num_pending, s.num_kept_tokens) == (3, 1, 0, 12)
    assert run.find(row_id="b")["num_kept_tokens"] == 10 and run.find(index=2)["error"] == "boom"


def test_not_a_run_directory_and_unknown_id(tmp_path, known_run):
    res = CliRunner().invoke(app, ["inspect", str(tmp_path)])
    assert isinstance(res.exception, OutputError) and "not an spcli output directory" in str(res.exception)
    res = CliRunner().invoke(app, ["inspect", str(known_run), "--id", "nope"])
    assert isinstance(res.exception, OutputError) and "no row with id 'nope' among its 6 committed rows" in str(res.exception)
    res = CliRunner().invoke(app, ["inspect", str(known_run), "--row", "6"])
    assert "--row 6 is out of range: the run has 6 committed rows (0..5)" in str(res.exception)


def test_on_a_real_run(tmp_path, tiny_dir, write_jsonl):
    """`spcli run` with the tiny model, then inspect: the summary agrees with the rows, a row re-tokenises."""
    from test_job_run import ARGS, prompt_rows, read_outputs

    jl = write_jsonl(prompt_rows(3) + [{"id": "bad", "prompt": 7}])
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", str(jl), "--out", str(out), "--model", str(tiny_dir), "--save-scores", *ARGS])
    assert res.exit_code == 0, res.output
    rows = {r["id"]: r for r in read_outputs(out)}
    res = CliRunner().invoke(app, ["inspect", str(out), "--width", "200"])
    assert res.exit_code == 0, res.output
    prompt = sum(r["num_prompt_tokens"] for r in rows.values() if r["error"] is None)
    kept = sum(r["num_kept_tokens"] for r in rows.values() if r["error"] is None)
    assert "4 done, 1 failed, 0 pending" in res.output
    assert f"{prompt} prompt -> {kept} kept" in res.output
    res = CliRunner().invoke(app, ["inspect", str(out), "--id", "r1"])
    assert res.exit_code == 0, res.output
    header, body = res.output.split("\n", 1)
    assert header.startswith(f"r1 | {rows['r1']['num_prompt_tokens']} prompt tokens | kept {rows['r1']['num_kept_tokens']} (30.")
    assert body.count("⟪") == 2  # the forced head and tail
    stripped = body.rstrip("\n")
    for marker in "⟦⟧⟮⟯⟪⟫":
        stripped = stripped.replace(marker, "")
    assert "word" in stripped and "warning" not in res.output


def _issue_run(out: Path, tiny_dir: Path, keep: float, prefill_s: float) -> Path:
    """The issue's 8 rows of ~850 tokens in one batch: keep 0.1 kept 86 per row; keep 1.0 kept all."""
    records = [{"id": f"t{i}", "prompt": "x"} for i in range(8)]
    kept = 850 if keep == 1.0 else 86
    results = [dict(output="o", finish_reason="length", num_prompt_tokens=850, num_kept_tokens=kept, num_output_tokens=20,
                    kept_indices=list(range(kept)), ttft_s=1.0, speculate_s=0.0 if keep == 1.0 else 26.7 / 8,
                    prefill_s=prefill_s, decode_s=1.0) for _ in records]
    return write_run(out, tiny_dir, records, results, SelectConfig(keep=keep), rows_per_part=8)


def test_time_saved_never_exceeds_the_measured_full_prefill(tmp_path, tiny_dir):
    """The issue's figures: 12.3 s of base prefill at keep 0.1 extrapolated linearly to 123 s of full prefill
    ("110.7 s saved"), while keep 1.0 took 54.6 s. Without a baseline the figure says it is an estimate; with
    the keep-1.0 run it is that run's measured time, and what is saved is the difference."""
    from spcli.inspect.outputs import load_run
    from spcli.inspect.summary import summarize

    pruned = _issue_run(tmp_path / "keep01", tiny_dir, 0.1, 12.3)
    full = _issue_run(tmp_path / "keep10", tiny_dir, 1.0, 54.6)
    estimated = summarize(load_run(pruned))
    assert not estimated.full_prefill.is_measured and estimated.saved_prefill_s <= estimated.full_prefill.seconds
    s = summarize(load_run(pruned), load_run(full))
    assert s.full_prefill.is_measured and s.full_prefill.seconds == pytest.approx(54.6)
    assert s.saved_prefill_s == pytest.approx(54.6 - 12.3) and s.saved_prefill_s <= s.full_prefill.seconds
    res = CliRunner().invoke(app, ["inspect", str(pruned), "--baseline", str(full), "--width", "300"])
    assert res.exit_code == 0, res.output
    assert (f"base prefill 12.3 s against 54.6 s for a full prefill (measured: {full} at keep 1.0, the same rows): "
            "42.3 s saved, for 26.7 s of speculation") in res.output
    res = CliRunner().invoke(app, ["inspect", str(pruned), "--width", "300"])
    assert "about 121.6 s for a full prefill (estimated: " in res.output and "an estimate, linear in tokens" in res.output
    res = CliRunner().invoke(app, ["inspect", str(pruned), "--baseline", str(pruned)])
    assert isinstance(res.exception, OutputError) and "not a full-prefill run" in str(res.exception)


def test_baseline_and_output_rates_on_measured_tiny_runs(tmp_path, tiny_dir, write_jsonl):
    """`spcli run` at keep 0.1 and at keep 1.0 on the same rows: with --baseline the full prefill is the keep-1.0
    run's measured base prefill, the saving never exceeds it; `done` and `inspect` give output tokens/s."""
    from test_job_run import prompt_rows, read_outputs

    from spcli.inspect.outputs import load_run
    from spcli.inspect.summary import summarize

    jl = write_jsonl(prompt_rows(4, words=300))
    args = ["--model", str(tiny_dir), "--speculator", "self:2", "--dtype", "float32", "--max-tokens", "6",
            "--min-tokens", "16", *ALWAYS_PRUNE, "--keep-last", "8", "--chunk", "8"]
    outs = {}
    for keep in ("0.1", "1.0"):
        outs[keep] = tmp_path / f"keep{keep}"
        res = CliRunner().invoke(app, ["run", str(jl), "--out", str(outs[keep]), "--keep", keep, *args])
        assert res.exit_code == 0, res.output
        rows = read_outputs(outs[keep])
        generated = sum(r["num_output_tokens"] for r in rows)
        assert re.search(rf"output tokens {generated}, \d+\.\d s \(\d+ prompt tok/s, \d+\.\d output tok/s\); outputs",
                         res.output), res.output
    full_s = json.loads((outs["1.0"] / "manifest.json").read_text())["shards"]["0"]["prefill_s"]
    s = summarize(load_run(outs["0.1"]), load_run(outs["1.0"]))
    assert s.full_prefill.is_measured and s.full_prefill.seconds == pytest.approx(full_s)
    assert 0 <= s.saved_prefill_s <= s.full_prefill.seconds
    assert s.saved_prefill_s == pytest.approx(max(0.0, full_s - s.prefill_s))
    res = CliRunner().invoke(app, ["inspect", str(outs["0.1"]), "--baseline", str(outs["1.0"]), "--width", "300"])
    assert res.exit_code == 0, res.output
    assert f"for a full prefill (measured: {outs['1.0']} at keep 1.0, the same rows)" in res.output
    assert re.search(r"prompt tokens/s, \d+\.\d output tokens/s \(\d+ generated\)", res.output), res.output
