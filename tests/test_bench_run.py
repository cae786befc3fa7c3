"""`spcli bench` on a tiny model: the --json schema, and ratios that follow from the stage timings."""

import json

from typer.testing import CliRunner

from spcli.cli import app

REQUIRED = {"keep", "length", "batch", "ttft_full_s", "ttft_spec_s", "speedup", "limit"}


def test_bench_json_schema_and_consistent_ratios(tmp_path, tiny_dir):
    res = CliRunner().invoke(app, ["bench", "--model", str(tiny_dir), "--speculator", "self:1", "--dtype", "float32",
                                   "--keep", "0.1,0.5", "--lengths", "300", "--batch", "2", "--repeats", "1",
                                   "--warmup", "0", "--max-tokens", "2", "--json", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in res.stdout.strip().splitlines()]
    assert [(r["keep"], r["length"], r["batch"]) for r in rows] == [(0.1, 300, 2), (0.5, 300, 2)]
    for r in rows:
        assert REQUIRED <= set(r)
        assert all(r[k] > 0 for k in ("ttft_full_s", "ttft_spec_s", "speedup", "limit"))
        # one repetition: the speedup is the ratio of the two TTFTs, the limit its formula
        assert abs(r["speedup"] - r["ttft_full_s"] / r["ttft_spec_s"]) < 1e-9
        expected = 1 / (r["kept_fraction"] + r["speculator_share"] + r["overhead_share"])
        assert abs(r["limit"] - expected) < 1e-9
        assert r["kept_fraction"] == (64 + 4 if r["keep"] == 0.1 else 150) / 300  # forced floor at 0.1 (budget 30)
        assert sum(r["stages"].values()) <= r["ttft_spec_s"] * 1.001
        assert r["throughput_full"] > 0 and r["throughput_spec"] > 0 and r["max_qps_full"] > 0
    assert (tmp_path / "bench_model_self-1.json").is_file()  # tiny_dir is .../model
    assert (tmp_path / "bench_model_self-1.png").stat().st_size > 1000


def test_bench_table_names_the_columns(tiny_dir):
    res = CliRunner().invoke(app, ["bench", "--model", str(tiny_dir), "--speculator", "self:1", "--keep", "0.3",
                                   "--lengths", "128", "--repeats", "1", "--warmup", "0", "--max-tokens", "1"])
    assert res.exit_code == 0, res.output
    assert "speedup" in res.stdout and "limit" in res.stdout and "0.30" in res.stdout


def test_bench_rejects_keep_one(tiny_dir):
    res = CliRunner().invoke(app, ["bench", "--model", str(tiny_dir), "--keep", "1.0"])
    assert res.exit_code != 0 and "--keep values must be in (0, 1)" in str(res.exception)
