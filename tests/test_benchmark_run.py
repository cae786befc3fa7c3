"""`spcli bench` on a tiny model: the --json schema, and ratios that follow from the stage timings."""

from tiny_models import ALWAYS_PRUNE
import json

from typer.testing import CliRunner

from spcli.cli import app

REQUIRED = {"keep", "length", "batch", "ttft_full_s", "ttft_spec_s", "speedup", "limit"}


def test_bench_json_schema_and_consistent_ratios(tmp_path, tiny_dir):
    res = CliRunner().invoke(app, ["bench", *ALWAYS_PRUNE, "--model", str(tiny_dir), "--speculator", "self:1", "--dtype", "float32",
                                   "--keep", "0.1,0.5", "--lengths", "300", "--batch", "2", "--repeats", "1",
                                   "--warmup", "0", "--max-tokens", "2", "--json", "--out", str(tmp_path),
                                   "--unit", "chunk", "--min-free", "0"])  # exact budgets
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in res.stdout.strip().splitlines()]
    assert [(r["keep"], r["length"], r["batch"]) for r in rows] == [(0.1, 300, 2), (0.5, 300, 2)]
    for r in rows:
        assert REQUIRED <= set(r)
        assert all(r[k] > 0 for k in ("ttft_full_s", "ttft_spec_s", "speedup", "limit"))
        # one repetition: the speedup is the ratio of the two TTFTs, the limit its formula
        assert abs(r["speedup"] - r["ttft_full_s"] / r["ttft_spec_s"]) < 1e-9
        expected = 1 / (r["kept_fraction"] + r["speculator_share"])
        assert abs(r["limit"] - expected) < 1e-9
        assert r["kept_fraction"] == (64 + 4 if r["keep"] == 0.1 else 150) / 300  # forced floor at 0.1 (budget 30)
        assert sum(r["stages"].values()) <= r["ttft_spec_s"] * 1.001
        assert r["throughput_full"] > 0 and r["throughput_spec"] > 0 and r["max_qps_full"] > 0
        assert r["settings_from"].startswith("fallback") and r["chunk"] == 32  # a folder with no preset or profile
    assert (tmp_path / "bench_model_self-1.json").is_file()  # tiny_dir is .../model
    assert (tmp_path / "bench_model_self-1.png").stat().st_size > 1000


def test_bench_table_names_the_columns(tiny_dir):
    res = CliRunner().invoke(app, ["bench", *ALWAYS_PRUNE, "--model", str(tiny_dir), "--speculator", "self:1", "--keep", "0.3",
                                   "--lengths", "128", "--repeats", "1", "--warmup", "0", "--max-tokens", "1"])
    assert res.exit_code == 0, res.output
    assert "speedup" in res.stdout and "limit" in res.stdout and "0.30" in res.stdout
    assert ("warning: one timed repetition: nothing shows how noisy this machine is; use --repeats 3 or more\n"
            in res.stderr)


def test_every_table_column_is_explained_in_help_and_readme():
    from pathlib import Path

    from spcli.benchmark.report import COLUMN_HELP
    from spcli.benchmark.run import text_table

    head = text_table([]).splitlines()[1].split("  ")
    assert [h.strip() for h in head if h.strip()] == [name for name, _ in COLUMN_HELP]
    res = CliRunner().invoke(app, ["bench", "--help"], env={"COLUMNS": "200"})
    readme = (Path(__file__).resolve().parents[1] / "docs" / "guide" / "bench.md").read_text()
    for name, text in COLUMN_HELP:
        assert f"{name}: {text}." in " ".join(res.output.replace("│", " ").split()), name
        assert f"`{name}`: {text}" in readme, name


def test_noisy_repetitions_are_flagged():
    from spcli.benchmark.report import reliability_warnings

    steady = {"length": 1024, "keep": 0.1, "repeats": 3, "speedups": [6.0, 6.2, 6.1], "speedup_median": 6.1}
    noisy = {**steady, "keep": 0.3, "speedups": [2.0, 2.6, 2.2], "speedup_median": 2.2}
    assert reliability_warnings([steady]) == []
    assert reliability_warnings([steady, noisy]) == [
        "length 1024 keep 0.3: per-repetition speedups spread 27% (over 10%): the machine is noisy, the ratio is unreliable"]


def test_lengths_beyond_the_context_are_refused_before_anything_runs(tiny_dir):
    res = CliRunner().invoke(app, ["bench", "--model", str(tiny_dir), "--lengths", "128,100000", "--max-tokens", "16"])
    assert res.exit_code != 0
    assert str(res.exception) == (f"--lengths 100000: with --max-tokens 16 it does not fit {tiny_dir}'s context of "
                                  "4096 tokens; use lengths up to 4080")


def test_bench_rejects_keep_one(tiny_dir):
    res = CliRunner().invoke(app, ["bench", "--model", str(tiny_dir), "--keep", "1.0"])
    assert res.exit_code != 0 and "--keep values must be in (0, 1)" in str(res.exception)
