"""`spcli run` end to end on JSONL and Parquet, through Typer's runner and a real subprocess."""

from tiny_models import ALWAYS_PRUNE
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from spcli.cli import app
from spcli.errors import ConfigError, InputError
from spcli.io.manifest import read_manifests


def read_outputs(out: Path) -> list[dict]:
    rows = []
    for doc in read_manifests(out):
        for shard in doc["shards"].values():
            for part in shard["parts"]:
                p = out / part
                if p.suffix == ".parquet":
                    rows += pq.read_table(p).to_pylist()
                else:
                    rows += [json.loads(line) for line in p.read_text().splitlines()]
    return rows


def prompt_rows(k: int, words: int = 120):
    return [{"id": f"r{i}", "prompt": " ".join(f"word{(i * 7 + j) % 50}" for j in range(words + 13 * i))} for i in range(k)]


ARGS = ["--keep", "0.3", "--min-tokens", "16", *ALWAYS_PRUNE, "--min-free", "0", "--unit", "chunk", "--keep-last", "8", "--chunk", "8",
        "--max-tokens", "5",
        "--dtype", "float32", "--lookahead", "2", "--speculator", "self:2"]


def test_run_jsonl_and_parquet_with_typer_runner(tmp_path, tiny_dir, write_jsonl):
    jl = write_jsonl(prompt_rows(5))
    pqf = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": ["p0", "p1"], "prompt": ["hello there " * 40, "a b c " * 30]}), pqf)
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", str(jl), str(pqf), "--out", str(out), "--model", str(tiny_dir),
                                   "--batch-size", "3", "--save-scores", *ARGS])
    assert res.exit_code == 0, res.output
    rows = read_outputs(out)
    assert sorted(r["id"] for r in rows) == ["p0", "p1", "r0", "r1", "r2", "r3", "r4"]
    for r in rows:
        assert r["error"] is None
        n, kept = r["num_prompt_tokens"], r["kept_indices"]
        assert kept == sorted(set(kept)) and 0 <= kept[0] and kept[-1] < n
        assert r["num_kept_tokens"] == len(kept) == -(-3 * n // 10)  # ceil(0.3 n)
        assert kept[-8:] == list(range(n - 8, n))  # the tail is forced
        assert len(r["importance"]) == n
        assert r["finish_reason"] in ("stop", "length") and r["ttft_s"] > 0
    assert "done: 7 rows (0 failed)" in res.output
    schema = pq.read_schema(next(out.glob("part-*.parquet")))
    assert schema.field("kept_indices").type == pa.list_(pa.int32())
    assert schema.field("num_prompt_tokens").type == pa.int32()


def test_batching_does_not_change_results(tmp_path, tiny_dir, write_jsonl):
    jl = write_jsonl(prompt_rows(4))
    runs = {}
    for bs in (1, 4):
        out = tmp_path / f"bs{bs}"
        res = CliRunner().invoke(app, ["run", str(jl), "--out", str(out), "--model", str(tiny_dir), "--batch-size", str(bs), *ARGS])
        assert res.exit_code == 0, res.output
        runs[bs] = {r["id"]: (r["kept_indices"], r["output"]) for r in read_outputs(out)}
    assert runs[1] == runs[4]


def test_keep_one_skips_the_speculator(tmp_path, tiny_dir, write_jsonl):
    jl = write_jsonl(prompt_rows(2))
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", str(jl), "--out", str(out), "--model", str(tiny_dir), "--keep", "1.0",
                                   "--max-tokens", "3", "--dtype", "float32"])
    assert res.exit_code == 0, res.output
    for r in read_outputs(out):
        assert r["num_kept_tokens"] == r["num_prompt_tokens"] and r["speculate_s"] == 0.0


def test_jsonl_output_format_and_error_rows(tmp_path, tiny_dir, write_jsonl):
    jl = write_jsonl([{"id": "ok", "prompt": "fine " * 30}, {"id": "bad", "prompt": 42}, "not json", {"id": "m", "messages": "x"}])
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", str(jl), "--out", str(out), "--model", str(tiny_dir), "--output-format", "jsonl", *ARGS])
    assert res.exit_code == 0, res.output
    rows = {r["id"]: r for r in read_outputs(out)}
    assert len(rows) == 4 and list(out.glob("part-*.jsonl"))
    assert rows["ok"]["error"] is None
    assert rows["bad"]["error"].endswith("in.jsonl:row 1 (line 2): field 'prompt' must be a string, got int")
    assert rows["bad"]["output"] is None
    assert "in.jsonl:row 2 (line 3): malformed JSON" in rows["in:2"]["error"]
    assert "field 'messages' must be a non-empty list" in rows["m"]["error"]


def test_unknown_model_is_a_clear_error_with_exit_2(tmp_path, write_jsonl):
    jl = write_jsonl(prompt_rows(1))
    proc = subprocess.run([sys.executable, "-m", "spcli", "run", str(jl), "--out", str(tmp_path / "o"), "--model", "no-such-model"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("spcli: error: unknown model 'no-such-model'")
    assert "Traceback" not in proc.stderr


def test_run_as_a_real_subprocess(tmp_path, tiny_dir, write_jsonl):
    jl = write_jsonl(prompt_rows(3))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "spcli", "run", str(jl), "--out", str(out), "--model", str(tiny_dir), *ARGS]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stderr
    assert "done: 3 rows (0 failed)" in proc.stdout
    assert "INFO inputs: 1 shard" in proc.stderr and "Loading weights" not in proc.stderr, \
        "log lines, but no loading bars when stderr is not a terminal"
    assert len(read_outputs(out)) == 3
    again = subprocess.run(cmd, capture_output=True, text=True)  # resume: nothing left to do
    assert (again.returncode, again.stdout) == (0, f"nothing to do: 3 rows already done; outputs in {out}\n")
    assert len(read_outputs(out)) == 3


def speculator_dtype_text(dtype: str) -> str:
    """What the banner's speculator line says of the speculator's dtype under --speculator-dtype auto on this CPU."""
    import torch

    from spcli.models.dtype import resolve_speculator_dtype

    picked, why = resolve_speculator_dtype("auto", dtype, torch.device("cpu"))
    return "" if picked == dtype else f", {picked} ({why})"


def test_start_banner_names_inputs_model_speculator_keep_engine_device_output(tmp_path, tiny_dir, write_jsonl):
    import dataclasses

    from spcli.config.scoring import ScoreConfig

    src = write_jsonl(prompt_rows(3))
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", str(src), "--out", str(out), "--model", str(tiny_dir), "--device", "cpu", *ARGS])
    assert res.exit_code == 0, res.output
    from spcli.models.profiles import resolve_score

    resolved = resolve_score(ScoreConfig(lookahead=2), str(tiny_dir), tiny_dir, "self:2")  # the model's defaults filled in
    score = ", ".join(f"{k} {v}" for k, v in dataclasses.asdict(resolved).items())
    spec_dtype = speculator_dtype_text("float32")
    assert [line for line in res.output.splitlines() if line.startswith("INFO ")][:6] == [
        "INFO inputs: 1 shard, 3 rows",
        f"INFO model: {tiny_dir}, float32 (--dtype)",
        f"INFO speculator: self:2, same tokenizer{spec_dtype} ({score}); settings from flags (lookahead, chunk), the rest from "
        f"fallback: early exit at the middle layer; `spcli calibrate --model {tiny_dir} --speculator self:2` measures "
        "them for this model",
        "INFO keep: 0.3 (chunk 8, keep_first 4, keep_last 8, min_tokens 16, min_free 0, unit chunk, "
        "protect system,instruction, max_prune_cost inf)",
        "INFO engine: hf, device cpu, batch size 8",
        f"INFO output: {out} (parquet)",
    ]


@pytest.mark.parametrize("where", ["before", "after"])
def test_quiet_prints_nothing_but_the_result_not_even_loading_bars(tmp_path, tiny_dir, write_jsonl, where):
    """`spcli -q run ...`, and `spcli run ... -q` (the issue: "No such option")."""
    src = write_jsonl(prompt_rows(2))
    out = tmp_path / "out"
    run = ["run", str(src), "--out", str(out), "--model", str(tiny_dir), *ARGS]
    cmd = [sys.executable, "-m", "spcli", *(["-q", *run] if where == "before" else [*run, "-q"])]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", "no banner, progress or third-party loading bars"
    assert proc.stdout.startswith("done: 2 rows (0 failed), ")


def test_readme_output_table_lists_every_column_with_its_type():
    import re

    from spcli.io.schema import output_schema

    readme = (Path(__file__).resolve().parents[1] / "docs" / "guide" / "run.md").read_text()
    table = readme.split("**Output**", 1)[1].split("\n\n", 2)[1]
    documented = {}
    for names, types in re.findall(r"^\| (`[^|]+`) \| ([^|]+) \|", table, re.M):
        names = re.findall(r"`([^`]+)`", names)
        types = [t.strip() for t in types.split(",")]
        documented.update(zip(names, types * len(names) if len(types) == 1 else types))
    schema = output_schema(save_scores=True)
    arrow = {"double": "float64", "float": "float32", "list<item: int32>": "list<int32>", "list<item: float>": "list<float32>"}
    struct = lambda t: "list<struct>" if t.startswith("list<item: struct<") else "struct" if t.startswith("struct<") else t
    assert documented == {f.name: struct(arrow.get(str(f.type), str(f.type))) for f in schema}


def test_pass_through_carries_input_columns_into_the_outputs(tmp_path, tiny_dir, write_jsonl):
    """The issue: input columns did not reach the outputs. --pass-through COLS copies them, by row, into every
    output row (a Parquet input's types kept), over several parts, in Parquet and JSONL output."""
    pqf = tmp_path / "tickets.parquet"
    prompts = [r["prompt"] for r in prompt_rows(3)]
    pq.write_table(pa.table({"id": ["p0", "p1", "p2"], "prompt": prompts, "ticket": pa.array([10, 11, 12], pa.int64()),
                             "team": ["a", None, "c"], "unused": [1, 2, 3]}), pqf)
    jl = write_jsonl([{"id": "j0", "prompt": prompts[0], "ticket": 20, "team": "x"}, '{"id": "j1", "prompt": ',
                      {"id": "j2", "prompt": prompts[1], "ticket": 22}])
    for fmt in ("parquet", "jsonl"):
        out = tmp_path / fmt
        res = CliRunner().invoke(app, ["run", str(pqf), str(jl), "--out", str(out), "--model", str(tiny_dir),
                                       "--batch-size", "2", "--commit-interval", "0", "--output-format", fmt,
                                       "--pass-through", "ticket,team", *ARGS])
        assert res.exit_code == 0, res.output
        rows = {r["id"]: r for r in read_outputs(out)}
        assert {i: (r["ticket"], r["team"]) for i, r in rows.items()} == {
            "p0": (10, "a"), "p1": (11, None), "p2": (12, "c"), "j0": (20, "x"), "in:1": (None, None),
            "j2": (22, None)}, "by row; a record that cannot be decoded gets nulls"
        assert all("unused" not in r for r in rows.values())
        if fmt == "parquet":
            assert pq.read_schema(next(out.glob("part-00000-*.parquet"))).field("ticket").type == pa.int64()
    res = CliRunner().invoke(app, ["run", str(pqf), "--out", str(tmp_path / "x"), "--model", str(tiny_dir),
                                   "--pass-through", "ticket,queue", *ARGS])
    assert isinstance(res.exception, InputError)
    assert str(res.exception) == (f"{pqf}: Parquet file has no column 'queue' (--pass-through); its columns: id, prompt, "
                                  "team, ticket, unused")
    res = CliRunner().invoke(app, ["run", str(pqf), "--out", str(tmp_path / "x"), "--model", str(tiny_dir),
                                   "--pass-through", "output", *ARGS])
    assert isinstance(res.exception, ConfigError) and "the output has its own column(s) of that name" in str(res.exception)
    assert not (tmp_path / "x").exists()
