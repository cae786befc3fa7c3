"""`spcli calibrate --keep-for`: keep calibration on the user's own records, on the tiny model (3 layers)."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from spcli.calibrate.keep import KeepForConfig, recommend, run_flags, sample_records
from spcli.cli import app
from spcli.config.run import FieldConfig
from spcli.config.scoring import ScoreConfig, SelectConfig
from spcli.errors import ConfigError


def records(k: int) -> list[dict]:
    return [{"id": f"r{i}", "prompt": " ".join(f"note{(i * 3 + j * 7) % 41}" for j in range(400 + 10 * i)), "keep": 1.0}
            for i in range(k)]


def test_keep_for_on_the_tiny_model_writes_results_plot_and_the_flags(tmp_path, tiny_dir, write_jsonl):
    src = write_jsonl(records(6) + ['{"broken": '])
    out = tmp_path / "cal"
    res = CliRunner().invoke(app, ["calibrate", "--keep-for", str(src), "--model", str(tiny_dir), "--speculator", "self:2",
                                   "--lookahead", "0", "--window", "4", "--score-layers", "1", "--dtype", "float32",
                                   "--samples", "4", "--keep", "0.2,0.5", "--min-tokens", "16", "--keep-min", "0.1",
                                   "--keep-max", "0.6", "--target-agreement", "0.5", "--out", str(out)])
    assert res.exit_code == 0, res.output
    results = json.loads((out / "results.json").read_text())
    assert (results["num_sampled"], results["num_valid_records"]) == (4, 6)
    assert [e["policy"] for e in results["summary"]] == [0.2, 0.5, "auto"]
    for e in results["summary"]:
        assert e["n"] == 4 and e["num_pruned"] == 4
        for m in ("first_token", "prefix_match", "kl", "kept_fraction"):
            assert set(e[m]) == {"mean", "lo", "hi", "n"} and e[m]["lo"] <= e[m]["mean"] <= e[m]["hi"]
    rows = [r for r in results["rows"] if r["policy"] == 0.2]
    assert all(r["num_kept"] == math.ceil(0.2 * r["num_prompt_tokens"]) for r in rows), "the records' own keep is ignored"
    full = [r for r in results["rows"] if r["policy"] == "full"]
    assert all(r["prefix_match"] == 1.0 and r["kl"] == 0.0 for r in full), "full prefill agrees with itself"
    assert (out / "keep_fidelity.png").stat().st_size > 5000
    last = res.stdout.strip().splitlines()[-1]
    if results["recommended"] is None:
        assert last.startswith("no keep in the sweep meets EM16 >= 0.5")
    else:
        assert last == f"recommended (smallest kept fraction meeting EM16 >= 0.5): {results['flags']}"
        assert f"--model {tiny_dir} --speculator self:2" in last and "--window 4 --lookahead 0 --score-layers 1" in last
    assert "fidelity against full prefill on 4 of your 6 records" in res.stdout
    assert f"skipped 1 bad record(s): {src}:row 6 (line 7): malformed JSON (" in res.stdout
    assert "KL <= 0.05 (--target-kl 0.05): " in res.stdout and "EM16 >= 0.5 (--target-agreement 0.5): " in res.stdout


def test_sample_is_seeded_uniform_and_in_input_order(tmp_path, write_jsonl):
    src = write_jsonl(records(40))
    cfg = lambda seed: KeepForConfig(inputs=(str(src),), samples=5, seed=seed)
    a, num_valid = sample_records(cfg(0))
    assert num_valid == 40 and len(a) == 5
    assert [r.id for r in a] == [r.id for r in sample_records(cfg(0))[0]]
    assert [r.id for r in a] != [r.id for r in sample_records(cfg(1))[0]]
    assert [r.row for r in a] == sorted(r.row for r in a) and all(r.keep is None for r in a)


def entry(policy, kept, em, kl=0.1):
    ci = lambda v: {"mean": v, "lo": v, "hi": v, "n": 8}
    return {"policy": policy, "kept_fraction": ci(kept), "prefix_match": ci(em), "kl": ci(kl), "first_token": ci(em)}


def test_recommend_takes_the_smallest_kept_fraction_that_meets_the_target():
    summary = [entry(0.1, 0.1, 0.5), entry(0.2, 0.2, 0.9), entry(0.3, 0.3, 0.95), entry("auto", 0.15, 0.92, kl=0.5)]
    cfg = KeepForConfig(inputs=("x",), target_agreement=0.9)
    assert recommend(summary, cfg)["policy"] == "auto"
    assert recommend(summary, KeepForConfig(inputs=("x",), target_kl=0.2))["policy"] == 0.1
    assert recommend(summary, KeepForConfig(inputs=("x",), target_agreement=0.99)) is None
    flags = run_flags(KeepForConfig(inputs=("x",), select=SelectConfig(keep="auto", keep_scale=0.8)), "auto")
    assert flags == "spcli run x --out DIR --model smollm2-135m --keep auto --keep-scale 0.8 --keep-min 0.05 --keep-max 0.5"
    flags = run_flags(KeepForConfig(inputs=("x",), select=SelectConfig(chunk=16), score=ScoreConfig(pool=5)), 0.2)
    assert flags == "spcli run x --out DIR --model smollm2-135m --keep 0.2 --pool 5 --chunk 16"  # given flags only


def test_the_table_ends_with_the_closest_keep_per_criterion_as_run_flags_and_says_what_limits_it():
    from spcli.calibrate.keep import closest
    from spcli.calibrate.keep_report import text_table

    summary = [entry(0.1, 0.1, 0.0, kl=0.2), entry(0.5, 0.5, 0.25, kl=0.011), entry("auto", 0.5, 0.25, kl=0.011)]
    for e in summary:
        e |= {"n": 3, "num_pruned": 3, "num_at_keep_max": 3 if e["policy"] == "auto" else 0}
    cfg = KeepForConfig(inputs=("x",))
    results = {"summary": summary, "target": {"metric": "prefix_match", "value": 0.9}, "num_sampled": 3,
               "num_valid_records": 4, "errors": [], "skipped": ["in.jsonl:row 1 (line 2): malformed JSON (unexpected end)"],
               "config": cfg.to_dict(), "closest": closest(summary, cfg), "recommended": None, "flags": None}
    flags = "spcli run x --out DIR --model smollm2-135m --keep"
    assert text_table(results).splitlines()[-6:] == [
        "skipped 1 bad record(s): in.jsonl:row 1 (line 2): malformed JSON (unexpected end)",
        "warning: 3 sampled records: 95% bootstrap CIs from fewer than 30 are rough and wide; raise --samples (on more "
        "records) before choosing by them",
        "keep auto kept --keep-max 0.5 on 3 of 3 pruned prompts: --keep-scale 1.5 asks for more there; raise --keep-max or "
        "lower --keep-scale",
        f"EM16 >= 0.9 (--target-agreement 0.9): not met in the sweep; closest keep 0.5 (EM16 0.25): {flags} 0.5; "
        "--keep 1.0 is full prefill",
        f"KL <= 0.05 (--target-kl 0.05): keep 0.5 meets it (KL 0.011): {flags} 0.5",
        "no keep in the sweep meets EM16 >= 0.9: use --keep 1.0 (full prefill), or sweep higher --keep values",
    ]


def test_bad_keep_for_flags_are_clear_errors(tmp_path, write_jsonl):
    with pytest.raises(ConfigError, match="not both"):
        KeepForConfig(inputs=("x",), target_agreement=0.9, target_kl=0.1)
    res = CliRunner().invoke(app, ["calibrate", "some.jsonl"])
    assert isinstance(res.exception, ConfigError) and "INPUT files are for --keep-for" in str(res.exception)
    res = CliRunner().invoke(app, ["calibrate", "--keep-for"])
    assert isinstance(res.exception, ConfigError) and "--keep-for needs INPUT" in str(res.exception)


def test_the_recommended_run_line_carries_the_users_inputs_and_field_flags():
    """The issue: the `spcli run` line calibrate recommended left out the user's `--prompt-field body`."""
    cfg = KeepForConfig(inputs=("data/tickets.parquet", "my data/b.jsonl"), fields=FieldConfig(prompt="body", id="ticket_id"),
                        select=SelectConfig(keep="auto", min_tokens=100))
    assert run_flags(cfg, 0.3) == ("spcli run data/tickets.parquet 'my data/b.jsonl' --out DIR --model smollm2-135m --keep 0.3 "
                                   "--min-tokens 100 --prompt-field body --id-field ticket_id")


def test_keep_for_reads_the_users_field_names(tmp_path, tiny_dir):
    """calibrate --keep-for takes spcli run's --prompt-field / --id-field, and its recommendation repeats them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "tickets.parquet"
    pq.write_table(pa.table({"ticket_id": [f"t{i}" for i in range(3)], "body": [r["prompt"] for r in records(3)],
                             "question": ["What is the code?"] * 3}), src)
    out = tmp_path / "cal"
    res = CliRunner().invoke(app, ["calibrate", "--keep-for", str(src), "--model", str(tiny_dir), "--speculator", "self:2",
                                   "--lookahead", "0", "--window", "4", "--score-layers", "1", "--dtype", "float32",
                                   "--samples", "3", "--keep", "0.5", "--min-tokens", "16", "--target-agreement", "0.01",
                                   "--prompt-field", "body", "--id-field", "ticket_id", "--instruction-field", "question",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert f"spcli run {src} --out DIR --model {tiny_dir} --speculator self:2 " in res.stdout
    assert "--prompt-field body --id-field ticket_id --instruction-field question" in res.stdout
