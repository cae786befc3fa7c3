"""spcli/stages/pays.py: a prompt whose pruning would not pay is prefilled whole, and the run says so."""

import dataclasses
import json
import math
from pathlib import Path

import pyarrow.parquet as pq
from tiny_models import ALWAYS_PRUNE
from typer.testing import CliRunner

from spcli.cli import app
from spcli.config.run import RunConfig
from spcli.config.scoring import SelectConfig
from spcli.stages.pays import cost, pays
from spcli.plan.configs import SHIPPED_CONFIGS
from spcli.plan.shapes import ModelShape
from spcli.models.profiles import resolve_score

SMOLLM2 = ModelShape.from_config("smollm2-135m", SHIPPED_CONFIGS["smollm2-135m"], "shipped")


def smollm2_score():
    from spcli.config.scoring import ScoreConfig
    from spcli.models.lookup import locate

    return resolve_score(ScoreConfig(), "smollm2-135m", locate("smollm2-135m"), "self")


def test_smollm2_self_pays_at_keep_0_1_not_at_0_5():
    """Its speculator runs 15 of its 30 layers: about half a full prefill before any kept token."""
    score, pair = smollm2_score(), (SMOLLM2, SMOLLM2)
    assert 0.55 < cost(*pair, score, 1500, 196) < 0.65  # speculator ~0.48 + 196 kept tokens ~0.13
    assert pays(pair, score, SelectConfig(keep=0.1), 0.1, 1500, 0)
    assert pays(pair, score, SelectConfig(keep=0.3), 0.3, 1500, 0)  # ~0.76
    assert not pays(pair, score, SelectConfig(keep=0.5), 0.5, 1500, 0)  # ~0.95
    assert not pays(pair, score, SelectConfig(keep=0.3), 0.3, 1500, 700)  # 700 protected tokens kept on top
    assert pays(pair, score, SelectConfig(keep=0.5, max_prune_cost=math.inf), 0.5, 1500, 0)
    assert pays(pair, score, SelectConfig(keep="auto"), "auto", 1500, 0)  # its budget is known after scoring


def test_a_bigger_base_pays_more_often():
    """The same speculator share of the layers costs less against a base 10x its size."""
    score, small = smollm2_score(), (SMOLLM2, SMOLLM2)
    big = ModelShape.from_config("llama-8b", SHIPPED_CONFIGS["llama-8b"], "shipped")
    assert cost(big, SMOLLM2, score, 1500, 450) < cost(*small, score, 1500, 450)


def test_the_fingerprint_leaves_out_always_prune():
    """Directories made before the rule (every prompt pruned) resume under --max-prune-cost inf."""
    base = RunConfig(inputs=("x",), out="o")
    always = dataclasses.replace(base, select=dataclasses.replace(base.select, max_prune_cost=math.inf))
    assert "max_prune_cost" not in always.fingerprint_fields()["select"]
    assert base.fingerprint_fields()["select"]["max_prune_cost"] == 0.9


def run_rows(tmp_path: Path, name: str, src: Path, tiny_dir: Path, *flags: str):
    out = tmp_path / name
    res = CliRunner().invoke(app, ["run", str(src), "--out", str(out), "--model", str(tiny_dir), "--keep", "0.3",
                                   "--min-tokens", "16", "--min-free", "0", "--keep-last", "8", "--max-tokens", "2", "--dtype", "float32",
                                   *flags])
    assert res.exit_code == 0, res.output + repr(res.exception)
    return res.output, pq.read_table(sorted(out.glob("*.parquet"))).to_pylist()


def test_a_run_prefills_whole_what_would_not_pay_and_says_so(tmp_path, tiny_dir, write_jsonl):
    """The tiny model's LM head costs more than its two layers: pruning never pays there."""
    src = write_jsonl([{"id": f"r{i}", "prompt": "the cat sat on the mat. " * (20 + 5 * i)} for i in range(3)])
    output, rows = run_rows(tmp_path, "whole", src, tiny_dir)
    assert all(r["num_kept_tokens"] == r["num_prompt_tokens"] > 16 for r in rows), rows
    assert "3 of 3 rows were prefilled whole" in output and "--max-prune-cost inf" in output
    _, pruned = run_rows(tmp_path, "pruned", src, tiny_dir, *ALWAYS_PRUNE)
    assert all(r["num_kept_tokens"] < r["num_prompt_tokens"] for r in pruned), pruned
    manifest = json.loads((tmp_path / "whole" / "manifest.json").read_text())
    assert json.dumps(manifest).count("max_prune_cost") >= 1
