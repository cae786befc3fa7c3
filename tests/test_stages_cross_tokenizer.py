"""Scoring across tokenizers through the stages a run uses: a tiny random-weight base on a tokenizer trained
on the essays (conftest `tiny_other_dir`), the real SmolLM2-135M as its speculator; and the same-tokenizer
path, which must keep today's exact indices."""

from __future__ import annotations

from tiny_models import ALWAYS_PRUNE
import math
import json

import pytest
import torch
from typer.testing import CliRunner

from tiny_models import build_tiny
from spcli.cli import app
from spcli.config.run import RunConfig
from spcli.config.scoring import ScoreConfig, SelectConfig
from spcli.stages.align import align, carry
from spcli.models.load import load_stack
from spcli.models.speculator import CROSS_TOKENIZER, SAME_TOKENIZER, scoring_path
from spcli.stages.prepare import prepare
from spcli.stages.select import select_tokens
from spcli.stages.speculate import speculate_batch
from spcli.stages.tokenize import cross_tokenize, encode, tokenize
from spcli.evaluate.compare import needle_spans
from spcli.evaluate.metrics import covered
from spcli.evaluate.tasks import task_examples
from spcli.io.manifest import read_manifests
from spcli.io.records import Record
from spcli.models.profiles import resolve

SCORE = ScoreConfig(window=32, lookahead=0, score_layers="14", pool=31, rows="mean")  # smollm2-135m's calibrated recipe
SELECT = SelectConfig(keep=0.1, chunk=8, keep_last=16, min_tokens=64, max_prune_cost=math.inf)
MESSAGES = [{"role": "system", "content": "Answer from the text. Ünïcödé ok: 東京 🙂."},
            {"role": "user", "content": "The café opened in 1987 in Zürich. " * 30 + "When did the café open?"}]


def records() -> list[Record]:
    return [Record(0, 0, "chat", messages=MESSAGES),
            Record(0, 1, "raw", prompt="Le naïve résumé — 東京タワー. " * 40 + "What is the tower?")]


@pytest.mark.parametrize("which", ["base", "speculator"])
def test_encode_gives_the_ids_of_tokenize(which, smollm2_dir, other_tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(other_tokenizer_dir if which == "base" else smollm2_dir)
    for rec in records():
        enc = encode(rec, tok)
        assert enc.ids == tokenize(rec, tok, 1 << 20, "error")
        assert len(enc.offsets) == len(enc.ids)
        contents = [m["content"] for m in rec.messages] if rec.messages else [rec.prompt]
        assert [enc.text[a:b] for a, b in enc.regions] == contents


def test_scoring_path_is_the_vocabulary_switch(tiny_dir, tiny_other_dir, smollm2_dir):
    assert scoring_path(tiny_dir, str(smollm2_dir)) == SAME_TOKENIZER
    assert scoring_path(tiny_dir, "self:2") == SAME_TOKENIZER
    assert scoring_path(tiny_other_dir, str(smollm2_dir)) == CROSS_TOKENIZER


def test_same_tokenizer_pair_keeps_the_exact_index_path(tmp_path, tiny_dir):
    """A separate speculator of the same vocabulary: no speculator ids, no alignment, and kept indices
    bit-identical to speculate -> select on the base's own ids (the path before cross-tokenizer scoring)."""
    spec_dir = build_tiny(tmp_path / "spec", tiny_dir, seed=3)
    stack = load_stack(str(tiny_dir), str(spec_dir), "float32", "cpu")
    assert stack.speculator_tokens is None
    cfg = resolve(RunConfig(inputs=("x",), out="y", model=str(tiny_dir), speculator=str(spec_dir),
                            select=SELECT, score=ScoreConfig(window=8, lookahead=2, score_layers="all", pool=3, rows="mean")),
                  str(tiny_dir), tiny_dir, str(spec_dir))
    prepared = prepare(records(), cfg, stack)
    for rec, req in zip(records(), prepared):
        assert req.speculator_ids is None and req.alignment is None and req.forced is None
        ids = tokenize(rec, stack.tokenizer, stack.max_prompt_tokens(cfg.generate.max_tokens), "error")
        (spec,) = speculate_batch(stack.speculator, [ids], cfg.score, stack.eos_ids, stack.device)
        assert req.token_ids == ids
        assert torch.equal(req.importance, spec.importance)
        assert torch.equal(req.kept, select_tokens(spec.importance, cfg.select, cfg.select.keep, units=req.units,
                                                   protected=req.protected))


def test_constructed_fact_ranks_first_under_both_tokenizers(smollm2_dir, other_tokenizer_dir):
    """Speculator importance on the fact's characters only: under the base's tokens the fact ranks first,
    and at keep 0.1 every base token of the fact is kept; the base's template tokens are forced."""
    from transformers import AutoTokenizer

    base, spec = AutoTokenizer.from_pretrained(other_tokenizer_dir), AutoTokenizer.from_pretrained(smollm2_dir)
    fact = "The secret café code is 4417-Zürich."
    filler = "Some essay prose about startups and painters. " * 40
    rec = Record(0, 0, "fact", messages=[{"role": "user", "content": filler + fact + " " + filler + "What is the code?"}])
    ids, spec_ids, alignment, _ = cross_tokenize(rec, base, spec, 1 << 20, "error")
    b, s = encode(rec, base), encode(rec, spec)
    fact_chars = lambda enc: (enc.text.index(fact), enc.text.index(fact) + len(fact))
    on_fact = lambda enc: torch.tensor([max(a, fact_chars(enc)[0]) < min(e, fact_chars(enc)[1]) for a, e in enc.offsets])
    spec_importance = torch.where(on_fact(s), 1.0, 0.01)  # the fact ranks first under the speculator's tokens
    importance = carry(spec_importance, alignment)
    fact_base = on_fact(b)
    assert importance[fact_base].min() > importance[~fact_base & ~alignment.forced].max()  # ... and the base's
    kept = select_tokens(importance, SELECT, 0.1, alignment.forced)
    assert set(fact_base.nonzero().flatten().tolist()) <= set(kept.tolist())
    assert set(alignment.forced.nonzero().flatten().tolist()) <= set(kept.tolist())
    assert alignment.forced[:2].all()  # "<s>", "[INST]": the base's own template, no counterpart
    assert len(ids) == len(b.ids) and spec_ids == s.ids


def test_real_speculator_finds_the_needle_across_tokenizers(tiny_other_dir):
    """SmolLM2-135M scores a needle prompt rendered in its own template; carried to the base's tokens, the
    needle is kept at keep 0.1 in both SmolLM2's own tokens and the base's."""
    stack = load_stack(str(tiny_other_dir), "smollm2-135m", "float32", "cpu", with_base=False)
    assert stack.speculator_tokens is not None
    (ex,) = task_examples(("niah",), (1536,), 1, 0, stack.tokenizer, stack.max_positions)
    rec = Record(0, 0, ex.id, messages=ex.messages)
    cfg = RunConfig(inputs=("x",), out="y", model=str(tiny_other_dir), speculator="smollm2-135m",
                    select=SelectConfig(keep=0.1, chunk=8, keep_last=16, max_prune_cost=math.inf), score=SCORE)
    (req,) = prepare([rec], cfg, stack)
    spec_tok = stack.speculator_tokens.tokenizer
    assert req.speculator_ids == tokenize(rec, spec_tok, 1 << 20, "error")
    (spec,) = speculate_batch(stack.speculator, [req.speculator_ids], SCORE, stack.speculator_eos_ids, stack.device)
    spec_recall = covered(select_tokens(spec.importance, cfg.select), needle_spans(spec_tok, ex, req.speculator_ids))
    base_recall = covered(req.kept, needle_spans(stack.tokenizer, ex, req.token_ids))
    assert req.forced[req.kept].sum() == req.forced.sum()  # every forced token is kept
    assert spec_recall >= 0.9 and base_recall >= 0.9, (spec_recall, base_recall)


def test_run_across_tokenizers_end_to_end(tmp_path, tiny_other_dir, write_jsonl):
    rows = [{"id": "chat", "messages": MESSAGES}, {"id": "raw", "prompt": records()[1].prompt},
            {"id": "short", "prompt": "too short to prune"}]
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", str(write_jsonl(rows)), "--out", str(out), "--model", str(tiny_other_dir),
                                   "--speculator", "smollm2-135m", "--keep", "0.2", "--chunk", "8", "--keep-last",
                                   "8", "--min-tokens", "64", *ALWAYS_PRUNE, "--window", "32", "--lookahead", "0",
                                   "--score-layers", "14", "--pool", "31", "--max-tokens", "3", "--dtype", "float32",
                                   "--output-format", "jsonl", "--save-scores"])
    assert res.exit_code == 0, res.output
    assert f"speculator: smollm2-135m, {CROSS_TOKENIZER}" in res.output
    (doc,) = read_manifests(out)
    assert doc["fingerprint_fields"]["scoring"] == CROSS_TOKENIZER
    got = {r["id"]: r for p in out.glob("part-*.jsonl") for r in map(json.loads, p.read_text().splitlines())}
    for rid in ("chat", "raw"):
        r = got[rid]
        assert r["error"] is None and len(r["importance"]) == r["num_prompt_tokens"]
        assert r["num_kept_tokens"] >= -(-2 * r["num_prompt_tokens"] // 10)  # forced tokens may add to ceil(0.2 n)
        assert r["num_kept_tokens"] < r["num_prompt_tokens"]
    assert got["short"]["num_kept_tokens"] == got["short"]["num_prompt_tokens"]


def test_alignment_of_a_chat_record_forces_exactly_the_base_template(smollm2_dir, other_tokenizer_dir):
    from transformers import AutoTokenizer

    base, spec = AutoTokenizer.from_pretrained(other_tokenizer_dir), AutoTokenizer.from_pretrained(smollm2_dir)
    rec = records()[0]
    b, s = encode(rec, base), encode(rec, spec)
    a = align(b.offsets, b.regions, s.offsets, s.regions)
    in_content = [any(max(x, lo) < min(y, hi) for lo, hi in b.regions) for x, y in b.offsets]
    assert a.forced.tolist() == [not c for c in in_content]
    forced_text = "".join(b.text[x:y] for (x, y), f in zip(b.offsets, a.forced.tolist()) if f)
    assert "[INST]" in forced_text and "<<SYS>>" in forced_text and "café" not in forced_text
