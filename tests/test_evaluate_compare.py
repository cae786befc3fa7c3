"""Full vs pruned comparison on a tiny random Llama (SmolLM2 tokenizer), and `spcli eval` end to end."""

import json

import pytest
import torch
from typer.testing import CliRunner

from spcli.cli import app
from spcli.config.scoring import SelectConfig
from spcli.stages.select import budget
from spcli.evaluate.compare import evaluate_example, load_models, needle_spans
from spcli.evaluate.config import EvalConfig
from spcli.evaluate.selectors import SELECTORS
from spcli.evaluate.tasks import Example, generate


@pytest.fixture(scope="module")
def models(tiny_dir):
    cfg = EvalConfig(out="unused", tasks=("niah",), model=str(tiny_dir), speculator="self:2", dtype="float32", device="cpu")
    return load_models(cfg)


def config(tiny_dir, **kw):
    base = dict(out="unused", tasks=("niah",), model=str(tiny_dir), speculator="self:2", dtype="float32", device="cpu",
                select=SelectConfig(keep=1.0, min_tokens=0, min_free=0, unit="chunk"))  # exact budgets
    return EvalConfig(**{**base, **kw})


def test_keep_one_is_full_prefill_for_every_selector(models, tiny_dir):
    ex = generate("niah", models.tokenizer, 512, 1, seed=0)[0]
    res = evaluate_example(models, ex, config(tiny_dir, keeps=(0.3, 1.0)))
    full = res.rows[0]
    assert full["selector"] == "full" and full["kl"] == 0.0
    at_one = [r for r in res.rows if r["keep"] == 1.0 and r["selector"] != "full"]
    assert sorted(r["selector"] for r in at_one) == sorted(SELECTORS)
    for r in at_one:
        assert r["kl"] == 0.0 and r["first_token"] == 1.0 and r["prefix_match"] == 1.0
        assert r["num_kept"] == full["num_prompt_tokens"] and r["output"] == full["output"]
    pruned = [r for r in res.rows if r["keep"] == 0.3]
    assert len(pruned) == len(SELECTORS)
    for r in pruned:
        assert r["num_kept"] == budget(r["num_prompt_tokens"], 0.3)
        assert r["kl"] >= 0.0 and 0.0 <= r["needle_kept"] <= 1.0
    assert len(res.overlaps) == len(SELECTORS) * (len(SELECTORS) - 1) // 2 * 2  # pairs x keeps


def test_pruned_kl_matches_a_direct_gappy_prefill(models, tiny_dir):
    """The KL in a row is the KL between the full run and a run over exactly the kept tokens."""
    ex = generate("niah", models.tokenizer, 400, 1, seed=1)[0]
    cfg = config(tiny_dir, keeps=(0.5,), selectors=("recency",))
    row = [r for r in evaluate_example(models, ex, cfg).rows if r["selector"] == "recency"][0]
    ids = models.tokenizer.apply_chat_template(ex.messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    n, b = len(ids), budget(len(ids), 0.5)
    with torch.no_grad():
        full = torch.log_softmax(models.base(input_ids=torch.tensor([ids])).logits[0, -1].float(), -1)
        kept = torch.arange(n - b, n)
        part = models.base(input_ids=torch.tensor([ids])[:, kept], position_ids=kept[None],
                           attention_mask=torch.ones(1, b, dtype=torch.long)).logits[0, -1].float()
    part = torch.log_softmax(part, -1)
    expected = float((full.exp() * (full - part)).sum())
    assert row["kl"] == pytest.approx(expected, rel=1e-3, abs=1e-6)


def test_needle_spans_point_at_the_needle_tokens(models):
    ex = generate("niah", models.tokenizer, 512, 1, seed=2)[0]
    ids = models.tokenizer.apply_chat_template(ex.messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    (start, end), = needle_spans(models.tokenizer, ex, list(ids))
    assert ex.answers[0] in models.tokenizer.decode(ids[start:end])
    assert needle_spans(models.tokenizer, Example("x", "input", prompt="hi"), [1]) == []


def test_spcli_eval_end_to_end(tmp_path, tiny_dir, write_jsonl):
    inp = write_jsonl([{"id": "a", "prompt": "word " * 400 + "Answer:", "answer": "blue"},
                       {"id": "b", "messages": [{"role": "user", "content": "x " * 300}], "answer": ["red", "green"]}])
    out = tmp_path / "eval"
    res = CliRunner().invoke(app, ["eval", str(inp), "--task", "niah", "--lengths", "512", "--samples", "2",
                                   "--model", str(tiny_dir), "--speculator", "self:2", "--keep", "0.2,1.0",
                                   "--selector", "specprefill,random", "--dtype", "float32", "--out", str(out),
                                   "--bootstrap", "200", "--html"])
    assert res.exit_code == 0, res.output
    results = json.loads((out / "results.json").read_text())
    assert {e["task"] for e in results["summary"]} == {"niah", "input"}
    entry = next(e for e in results["summary"] if (e["task"], e["selector"], e["keep"]) == ("niah", "random", 0.2))
    assert entry["n"] == 2 and set(entry["metrics"]) >= {"contains", "exact", "f1", "first_token", "prefix_match", "kl"}
    for ci in entry["metrics"].values():
        assert set(ci) == {"mean", "lo", "hi", "n"}
    assert entry["overlap"]["specprefill"]["n"] == 2
    assert len(results["rows"]) == 4 * (1 + 2 * 2)  # examples x (full + selectors x keeps)
    for name in ("quality_niah.png", "speedup_niah.png", "quality_input.png", "report.html"):
        assert (out / name).stat().st_size > 1000
    assert "task niah" in res.output and "specprefill" in res.output


def test_bad_flags_are_clear_errors(tmp_path):
    res = CliRunner().invoke(app, ["eval", "--task", "niah", "--selector", "magic", "--out", str(tmp_path)])
    assert res.exit_code != 0 and "unknown selector 'magic'" in str(res.exception)
    res = CliRunner().invoke(app, ["eval", "--out", str(tmp_path)])
    assert "give INPUT files or at least one --task" in str(res.exception)


def test_lengths_beyond_the_context_are_fitted_with_room_to_answer(models, tiny_dir):
    from spcli.evaluate.run import build_examples

    said = []
    examples = build_examples(config(tiny_dir, lengths=(900,), samples=2), models.tokenizer, max_positions=700, log=said.append)
    assert "using 636" in said[0]
    for ex in examples:
        ids = models.tokenizer.apply_chat_template(ex.messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert len(ids) <= 700 - 32


def test_eval_auto_policy_is_matched_by_a_fixed_keep_and_compared_paired(tmp_path, tiny_dir):
    out = tmp_path / "eval"
    res = CliRunner().invoke(app, ["eval", "--task", "niah,niah-scatter", "--lengths", "512", "--samples", "2",
                                   "--model", str(tiny_dir), "--speculator", "self:2", "--keep", "auto:0.5,1.0",
                                   "--keep-min", "0.1", "--keep-max", "0.4", "--selector", "specprefill",
                                   "--dtype", "float32", "--out", str(out), "--bootstrap", "200",
                                   "--min-tokens", "0", "--max-tokens", "4", "--compare-tokens", "4",
                                   "--min-free", "0", "--unit", "chunk"])  # exact budgets
    assert res.exit_code == 0, res.output
    results = json.loads((out / "results.json").read_text())
    ((policy, fixed),) = results["matched_keeps"].items()
    assert policy == "auto:0.5" and 0.1 <= fixed <= 0.41
    rows = [r for r in results["rows"] if r["selector"] == "specprefill"]
    autos = [r for r in rows if r["keep"] == "auto:0.5"]
    assert len(autos) == 4 and all(0.1 <= r["num_kept"] / r["num_prompt_tokens"] <= 0.41 for r in autos)
    assert abs(sum(r["num_kept"] / r["num_prompt_tokens"] for r in autos) / 4 - fixed) < 1e-3  # pooled mean = fixed
    fixed_rows = {r["id"]: r for r in rows if r["keep"] == fixed}
    assert all(r["num_kept"] == budget(r["num_prompt_tokens"], fixed) for r in fixed_rows.values())
    entry = next(e for e in results["matched"] if e["task"] == "all")
    assert entry["n"] == 4 and entry["fixed"] == fixed
    want = sum(a["prefix_match"] - fixed_rows[a["id"]]["prefix_match"] for a in autos) / 4
    assert entry["delta"]["prefix_match"]["mean"] == pytest.approx(want)
    assert {e["task"] for e in results["matched"]} == {"niah", "niah-scatter", "all"}
    assert "adaptive vs fixed keep at the same mean kept fraction" in res.output
    assert "auto:0.5 vs " in res.output and (out / "quality_niah-scatter.png").stat().st_size > 1000


def test_eval_reads_the_users_field_names_as_spcli_run_does(tmp_path, tiny_dir):
    """The issue: `spcli eval data/tickets.parquet` said "name yours with --prompt-field", and eval had no such flag."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import dataclasses

    from spcli.config.run import FieldConfig
    from spcli.evaluate.journal import fingerprint

    src = tmp_path / "tickets.parquet"
    pq.write_table(pa.table({"ticket_id": ["t1", "t2"], "body": ["word " * 300 + "Answer:", "note " * 280 + "Answer:"],
                             "answer": ["blue", "red"]}), src)
    args = ["eval", str(src), "--samples", "2", "--model", str(tiny_dir), "--speculator", "self:2", "--keep", "0.5,1.0",
            "--selector", "specprefill", "--dtype", "float32", "--bootstrap", "200", "--max-tokens", "2",
            "--compare-tokens", "2"]
    res = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "e0")])
    assert res.exit_code != 0 and "name yours with --prompt-field" in str(res.exception)
    res = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "e1"), "--prompt-field", "body", "--id-field", "ticket_id"])
    assert res.exit_code == 0, res.output
    results = json.loads((tmp_path / "e1" / "results.json").read_text())
    assert {e["task"] for e in results["summary"]} == {"input"}
    assert results["config"]["fields"] | {"prompt": "body", "id": "ticket_id"} == results["config"]["fields"]
    assert {r["id"] for r in results["rows"]} == {"t1", "t2"}, "ids from --id-field"
    assert "fields" not in fingerprint({"fields": dataclasses.asdict(FieldConfig())}), \
        "the default names leave older journals' fingerprints as they were"
