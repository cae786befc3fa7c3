"""The benches that are not run elsewhere still run (a bench left behind by a changed signature fails here)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import runpy
import subprocess
import sys
import unittest.mock
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def bench(name: str, *args: str) -> subprocess.CompletedProcess:
    """benches/NAME run as a user runs it, with this checkout on the path."""
    return subprocess.run([sys.executable, str(REPO / "benches" / name), *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})


def bench_here(name: str, *args: str) -> subprocess.CompletedProcess:
    """benches/NAME run as its `__main__` in this process: the same code without a new interpreter's ~8 s of
    imports (for a bench called several times in one test, after one call as a user runs it)."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            unittest.mock.patch.object(sys, "argv", [name, *args]):
        try:
            runpy.run_path(str(REPO / "benches" / name), run_name="__main__")
        except SystemExit as e:  # as the interpreter reports it: a message goes to stderr with exit 1
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if isinstance(e.code, str):
                err.write(e.code + "\n")
    return subprocess.CompletedProcess([name, *args], code, out.getvalue(), err.getvalue())


def test_eval_pairs_bench_gives_the_paired_differences_of_the_journal_rows(tmp_path, tiny_dir):
    from spcli.config.scoring import SelectConfig
    from spcli.evaluate.config import EvalConfig
    from spcli.evaluate.run import run_eval

    out = tmp_path / "e"
    cfg = EvalConfig(out=str(out), tasks=("niah", "niah-multi"), lengths=(512,), samples=1, model=str(tiny_dir),
                     speculator="self:2", keeps=(0.3, 1.0), selectors=("specprefill", "random"), dtype="float32",
                     device="cpu", bootstrap=200, select=SelectConfig(keep=1.0, min_tokens=0))
    rows = run_eval(cfg, log=lambda _: None)["rows"]
    proc = bench("eval_pairs.py", str(out), "random", "--metric", "kl")
    assert proc.returncode == 0, proc.stderr[-2000:]
    entries = {(e["selector"], e["keep"], e["task"]): e["delta"] for e in
               json.loads((out / "pairs-random.json").read_text())}
    ref = {(r["id"], r["keep"]): r["kl"] for r in rows if r["selector"] == "random"}  # KL: nonzero on random weights
    keep = 0.3
    got = [r for r in rows if r["selector"] == "specprefill" and r["keep"] == keep]
    want = [r["kl"] - ref[(r["id"], keep)] for r in got]
    assert entries[("specprefill", keep, "all")]["n"] == len(want) == 2
    assert abs(entries[("specprefill", keep, "all")]["mean"] - sum(want) / 2) < 1e-12 and any(want)
    niah = [r["kl"] - ref[(r["id"], keep)] for r in got if r["task"] == "niah"]
    assert abs(entries[("specprefill", keep, "niah")]["mean"] - sum(niah)) < 1e-12
    assert not any(s == "random" for s, _, _ in entries)  # the reference is not paired with itself
    bad = bench_here("eval_pairs.py", str(out), "nope")
    assert bad.returncode != 0 and "no rows of selector 'nope'" in bad.stderr
    # against full prefill (keep 1.0 only): every keep pairs with the same example's full row
    assert bench_here("eval_pairs.py", str(out), "full", "--metric", "kl").returncode == 0
    vs_full = {(e["selector"], e["keep"], e["task"]): e["delta"] for e in
               json.loads((out / "pairs-full.json").read_text())}
    full = {r["id"]: r["kl"] for r in rows if r["selector"] == "full"}
    want = [r["kl"] - full[r["id"]] for r in got]
    assert vs_full[("specprefill", keep, "all")]["n"] == 2 and any(want)
    assert abs(vs_full[("specprefill", keep, "all")]["mean"] - sum(want) / 2) < 1e-12

    # a later eval of the same examples pairs with this one: its rows come in as LABEL:SELECTOR
    later = tmp_path / "later"
    run_eval(dataclasses.replace(cfg, out=str(later), keeps=(0.3,), selectors=("random",)), log=lambda _: None)
    proc = bench_here("eval_pairs.py", str(out), "later:random", "--metric", "kl", "--with", f"{later}=later")
    assert proc.returncode == 0, proc.stderr[-2000:]
    merged = {(e["selector"], e["keep"], e["task"]): e["delta"] for e in
              json.loads((out / "pairs-later:random+later.json").read_text())}
    # seeded: the same picks, so the same KL up to float noise between two runs
    assert abs(merged[("random", keep, "all")]["mean"]) < 1e-6 and merged[("random", keep, "all")]["n"] == 2
    assert abs(merged[("specprefill", keep, "all")]["mean"] - entries[("specprefill", keep, "all")]["mean"]) < 1e-6
    journal = later / "examples.jsonl"
    journal.write_text(journal.read_text().replace('"num_prompt_tokens": ', '"num_prompt_tokens": 1', 1))
    other = bench_here("eval_pairs.py", str(out), "random", "--with", f"{later}=later")
    assert other.returncode != 0 and "not the same examples" in other.stderr


def test_stage_profile_times_every_stage_of_both_variants(tmp_path, tiny_dir):
    out = tmp_path / "stages.md"
    proc = bench("stage_profile.py", "--model", str(tiny_dir), "--n", "2", "--length", "700", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split("|") for line in out.read_text().splitlines() if line.startswith("| now") or line.startswith("| chunks")]
    assert [r[1].strip() for r in rows] == ["now", "chunks"]
    for r in rows:
        assert 600 <= float(r[2]) <= 800 and float(r[10]) > 0 and r[12].strip().endswith("x")  # tokens, full prefill s, ratio


def test_summaries_bench_compares_each_keep_with_full_prefill(tmp_path, tiny_dir):
    proc = bench("summaries.py", "--model", str(tiny_dir), "--n", "2", "--keeps", "0.3", "--max-tokens", "2",
                 "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads((tmp_path / "summaries.json").read_text())["results"]
    assert sorted(results) == ["0.3", "1.0"]
    assert results["1.0"]["rouge_l_mean"] == 1.0 and results["1.0"]["ttft_ratio"] == 1.0  # full against itself
    assert 0.0 <= results["0.3"]["rouge_l_mean"] <= 1.0 and results["0.3"]["ttft_s"] > 0


def test_shared_docs_rules_bench_reports_every_rule_at_every_group_size(tmp_path, tiny_dir):
    out = tmp_path / "rules"
    proc = bench("shared_docs_rules.py", "--model", str(tiny_dir), "--facts", "3", "--sizes", "1,3", "--doc-tokens",
                 "560", "--keeps", "0.3", "--max-tokens", "3", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    groups = [json.loads(line) for line in (out / "groups.jsonl").read_text().splitlines()]
    seen = {(g["Q"], g["keep"], g["rule"]) for g in groups}
    assert seen == {(q, 1.0, "full") for q in (1, 3)} | {(q, 0.3, r) for q in (1, 3)
                                                          for r in ("a", "b", "c", "c@b", "c+top", "kvzip")}
    by = {(g["Q"], g["keep"], g["rule"]): g for g in groups}
    full, a, b = by[3, 1.0, "full"], by[3, 0.3, "a"], by[3, 0.3, "b"]
    assert full["base_tokens"] == full["p"] + full["spec_tokens_alone"] - 3 * full["p"]  # the document once
    assert b["base_tokens"] <= a["base_tokens"] and by[1, 0.3, "b"]["base_tokens"] == by[1, 0.3, "a"]["base_tokens"]
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == sum(g["Q"] for g in groups) and all(r["acc"] is not None for r in rows)
    assert "c+top" in proc.stdout and "vs full" in proc.stdout
    joined = bench_here("shared_docs_rules.py", "--model", str(tiny_dir), "--from", f"{out},{out}")  # no model runs
    assert joined.returncode == 0, joined.stderr[-2000:]
    table = lambda text: [line.split()[:4] for line in text.splitlines() if not line.startswith("#")][1:]
    assert [[*cells[:3], str(2 * int(cells[3]))] for cells in table(proc.stdout)] == table(joined.stdout)  # n twice
