"""`spcli eval` writes each finished example to examples.jsonl and resumes from it; `--speculator A,B` scores
with both in one run (one full prefill per example), B's rows as `specprefill@B`. Tiny random Llama."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spcli.config.scoring import SelectConfig
from spcli.errors import ConfigError
from spcli.evaluate import compare
from spcli.evaluate.config import EvalConfig
from spcli.evaluate.journal import EXAMPLES
from spcli.evaluate.run import journal_summary, run_eval

ROOT = Path(__file__).resolve().parents[1]


def config(tiny_dir, out, **kw):
    base = dict(out=str(out), tasks=("niah",), lengths=(512,), samples=2, model=str(tiny_dir), speculator="self:2",
                keeps=(0.3, 1.0), selectors=("specprefill", "random"), dtype="float32", device="cpu", bootstrap=200,
                select=SelectConfig(keep=1.0, min_tokens=0))
    return EvalConfig(**{**base, **kw})


def counting(monkeypatch) -> list[str]:
    """Ids of the examples evaluate_example really runs."""
    seen, real = [], compare.evaluate_example

    def spy(m, ex, *args, **kw):
        seen.append(ex.id)
        return real(m, ex, *args, **kw)

    monkeypatch.setattr("spcli.evaluate.run.evaluate_example", spy)
    return seen


def test_an_interrupted_eval_resumes_and_gives_the_rows_of_one_whole_run(tmp_path, tiny_dir, monkeypatch):
    whole = run_eval(config(tiny_dir, tmp_path / "whole"), log=lambda _: None)
    out = tmp_path / "resumed"
    first = run_eval(config(tiny_dir, out, samples=1), log=lambda _: None)  # stopped after one example
    with open(out / EXAMPLES, "ab") as f:
        f.write(b'{"id": "torn')  # the process died mid-write of the next example
    partial = journal_summary(out, bootstrap=200)  # what benches/eval_partial.py reports, with no model loaded
    assert (partial["num_examples"], partial["examples_by_task"]) == (1, {"niah": 1})
    assert partial["summary"] == first["summary"]
    assert (out / EXAMPLES).read_bytes().endswith(b'{"id": "torn')  # read only: an eval may be writing there
    bench = subprocess.run([sys.executable, str(ROOT / "benches" / "eval_partial.py"), str(out)], capture_output=True,
                           text=True, check=True)
    assert bench.stdout.startswith("1 examples: niah 1")
    assert json.loads((out / "partial_summary.json").read_text())["num_examples"] == 1
    seen, lines = counting(monkeypatch), []
    resumed = run_eval(config(tiny_dir, out), log=lines.append)  # a larger --samples resumes and adds
    assert seen == ["niah-512-0-1"]  # only the example not yet done ran
    assert any("1 examples already done" in line for line in lines)
    strip = lambda rows: [{k: v for k, v in r.items() if not k.endswith("_s")} for r in rows]  # timings differ
    assert strip(resumed["rows"]) == strip(whole["rows"])
    assert strip(resumed["rows"][: len(first["rows"])]) == strip(first["rows"])
    assert [json.loads(line)["id"] for line in (out / EXAMPLES).read_text().splitlines()] == ["niah-512-0-0", "niah-512-0-1"]
    seen.clear()
    run_eval(config(tiny_dir, out, bootstrap=300), log=lambda _: None)  # report-only settings: nothing reruns
    assert seen == []


def test_a_resume_with_other_settings_is_refused_naming_them(tmp_path, tiny_dir, monkeypatch):
    out = tmp_path / "e"
    run_eval(config(tiny_dir, out, samples=1), log=lambda _: None)

    def no_load(cfg):
        raise AssertionError("the models were loaded before the journal refused the resume")

    monkeypatch.setattr("spcli.evaluate.run.load_models", no_load)  # the flags are checked first
    with pytest.raises(ConfigError, match=r"other settings \(keeps, selectors differ\)"):
        run_eval(config(tiny_dir, out, samples=1, keeps=(0.2, 1.0), selectors=("random",)), log=lambda _: None)


def test_more_speculators_are_scored_in_the_same_run_each_with_its_own_settings(tmp_path, tiny_dir):
    both = run_eval(config(tiny_dir, tmp_path / "both", samples=1, speculator="self:2", extra_speculators=("self:3",),
                           selectors=("specprefill",)), log=lambda _: None)
    alone = run_eval(config(tiny_dir, tmp_path / "alone", samples=1, speculator="self:3", selectors=("specprefill",)),
                     log=lambda _: None)
    pick = lambda res, sel: {(r["keep"], r["num_kept"], r["output"]) for r in res["rows"] if r["selector"] == sel}
    assert pick(both, "specprefill@self:3") == pick(alone, "specprefill")  # as if it were the only speculator
    assert pick(both, "full") == pick(alone, "full")
    (compared,) = both["compared_speculators"]
    assert compared["label"] == "specprefill@self:3" and compared["speculator"] == "self:3"
    row = next(e for e in both["summary"] if e["selector"] == "specprefill@self:3" and e["keep"] == 0.3)
    assert row["delta_vs_specprefill"]["n"] == 1  # paired against the first speculator's rows
    assert [e["selector"] for e in both["summary"] if e["keep"] == 0.3] == ["specprefill", "specprefill@self:3"]


def test_a_speculator_named_twice_is_refused(tiny_dir, tmp_path):
    with pytest.raises(ConfigError, match="names a speculator twice"):
        config(tiny_dir, tmp_path, speculator="self:2", extra_speculators=("self:2",))


def test_a_variant_scores_with_the_first_speculator_at_other_settings(tmp_path, tiny_dir):
    from spcli.config.scoring import ScoreConfig
    from spcli.evaluate.config import parse_variant

    both = run_eval(config(tiny_dir, tmp_path / "both", samples=1, selectors=("specprefill",),
                           variants=(parse_variant("rows=max,window=4"),)), log=lambda _: None)
    alone = run_eval(config(tiny_dir, tmp_path / "alone", samples=1, selectors=("specprefill",),
                            score=ScoreConfig(rows="max", window=4)), log=lambda _: None)
    pick = lambda res, sel: {(r["keep"], r["num_kept"], r["output"]) for r in res["rows"] if r["selector"] == sel}
    assert pick(both, "specprefill[rows=max,window=4]") == pick(alone, "specprefill")
    (compared,) = both["compared_speculators"]
    assert compared["score"]["rows"] == "max" and compared["score"]["window"] == 4
    assert compared["score"]["score_layers"] == both["score"]["score_layers"]  # the rest: the first speculator's


def test_bad_variants_are_refused_naming_the_flag(tiny_dir, tmp_path):
    from spcli.evaluate.config import parse_variant

    for text, match in (("rows", "KEY=VALUE"), ("depth=3", "KEY=VALUE"), ("pool=x", "integer")):
        with pytest.raises(ConfigError, match=match):
            parse_variant(text)
    with pytest.raises(ConfigError, match="--pool must be an odd"):
        config(tiny_dir, tmp_path, variants=(parse_variant("pool=4"),))
