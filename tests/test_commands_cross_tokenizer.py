"""eval, bench and calibrate with a speculator of another tokenizer: the tiny base on the trained tokenizer
(conftest `tiny_other_dir`, vocab 2000) and the tiny random model on SmolLM2's tokenizer as speculator
(`tiny_dir`, vocab 49152): mechanics only, on random weights (quality: test_stages_cross_tokenizer.py)."""

from __future__ import annotations

from tiny_models import ALWAYS_PRUNE
import json
import math

import torch
from typer.testing import CliRunner

from spcli.cli import app
from spcli.config.scoring import ScoreConfig, SelectConfig
from spcli.models.load import load_stack
from spcli.models.speculator import CROSS_TOKENIZER
from spcli.evaluate.compare import evaluate_example, example_signals, prompt_ids
from spcli.evaluate.config import EvalConfig
from spcli.evaluate.selectors import select
from spcli.evaluate.tasks import task_examples
from spcli.models.profiles import resolve

SCORE_FLAGS = ["--window", "8", "--lookahead", "2", "--score-layers", "all", "--pool", "3"]


def test_eval_carries_every_speculator_signal_to_the_base_tokens(tmp_path, tiny_other_dir, tiny_dir):
    m = load_stack(str(tiny_other_dir), str(tiny_dir), "float32", "cpu")
    cfg = EvalConfig(out=str(tmp_path), tasks=("niah",), lengths=(400,), model=str(tiny_other_dir),
                     speculator=str(tiny_dir), keeps=(0.2, 1.0), samples=1, select=SelectConfig(keep=1.0, min_tokens=256),
                     selectors=("specprefill", "specprefill-paper", "self-information", "random"),
                     score=ScoreConfig(window=8, lookahead=2, score_layers="all", pool=3, rows="mean"))
    cfg = resolve(cfg, cfg.model, m.path, m.speculator_name)
    (ex,) = task_examples(cfg.tasks, cfg.lengths, 1, 0, m.tokenizer, m.max_positions)
    ids, _ = prompt_ids(m, ex, cfg)
    signals = example_signals(m, ex, ids, cfg)
    n = len(ids)
    assert signals.forced is not None and signals.forced.shape == (n,) and signals.forced.any()
    for v in (signals.importance, signals.surprisal, signals.paper_importance):
        assert v.shape == (n,) and v.dtype == torch.float32
    for s in ("specprefill", "specprefill-paper", "self-information"):
        kept = select(s, n, signals, cfg.select, 0.2, 0)
        assert set(signals.forced.nonzero().flatten().tolist()) <= set(kept.tolist())
        assert kept.numel() >= math.ceil(0.2 * n)
    result = evaluate_example(m, ex, cfg, signals)
    assert {(r["selector"], r["keep"]) for r in result.rows} >= {("specprefill", 0.2), ("full", 1.0)}


def test_bench_across_tokenizers_says_so(tmp_path, tiny_other_dir, tiny_dir):
    res = CliRunner().invoke(app, ["bench", *ALWAYS_PRUNE, "--model", str(tiny_other_dir), "--speculator", str(tiny_dir), "--dtype",
                                   "float32", "--keep", "0.3", "--lengths", "300", "--repeats", "1", "--warmup", "0",
                                   "--max-tokens", "2", "--json", "--out", str(tmp_path), *SCORE_FLAGS])
    assert res.exit_code == 0, res.output
    (row,) = [json.loads(line) for line in res.stdout.strip().splitlines()]
    assert row["scoring"] == CROSS_TOKENIZER
    assert 0.3 <= row["kept_fraction"] < 1.0 and row["speedup"] > 0


def test_calibrate_measures_a_cross_tokenizer_speculator_in_its_own_tokens(tmp_path, tiny_other_dir, tiny_dir):
    out = tmp_path / "calib"
    res = CliRunner().invoke(app, ["calibrate", "--model", str(tiny_other_dir), "--speculator", str(tiny_dir),
                                   "--tasks", "niah", "--lengths", "300", "--samples", "1", "--keep", "0.5",
                                   "--windows", "4", "--out", str(out), "--device", "cpu"])
    assert res.exit_code == 0, res.output + repr(res.exception)
    doc = json.loads((out / "results.json").read_text())
    assert doc["num_layers"] == 3 and doc["examples"][0]["num_fact_tokens"] > 0
    assert doc["scoring"] == CROSS_TOKENIZER


def test_calibrate_keep_for_across_tokenizers(tmp_path, tiny_other_dir, tiny_dir, write_jsonl):
    rows = [{"id": f"r{i}", "messages": [{"role": "user", "content": "The café in Zürich. " * (60 + 10 * i)}]}
            for i in range(2)]
    out = tmp_path / "cal"
    res = CliRunner().invoke(app, ["calibrate", "--keep-for", str(write_jsonl(rows)), "--model", str(tiny_other_dir),
                                   "--speculator", str(tiny_dir), "--dtype", "float32", "--keep", "0.3",
                                   "--min-tokens", "16", "--out", str(out), *SCORE_FLAGS])
    assert res.exit_code == 0, res.output + repr(res.exception)
    results = json.loads((out / "results.json").read_text())
    pruned = [r for r in results["rows"] if r["policy"] == 0.3]
    assert len(pruned) == 2 and all(math.ceil(0.3 * r["num_prompt_tokens"]) <= r["num_kept"] < r["num_prompt_tokens"]
                                    for r in pruned)
