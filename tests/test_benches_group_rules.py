"""benches/group_rules.py: a document's shared length, each rule's cost over full prefill with the document prefilled
once, and the bench run end to end on the tiny model (the real pair's run is by hand: docs/results/qa-job)."""

from __future__ import annotations

import json
import sys

import pytest

from test_benches import REPO

sys.path.insert(0, str(REPO / "benches"))
import group_rules  # noqa: E402
import qa_job  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from spcli.models.files import load_tokenizer

    return load_tokenizer(smollm2_dir)


def test_the_document_length_is_what_every_question_of_it_starts_with(tokenizer):
    doc = qa_job.make_document(tokenizer, 0, 3, 400, 0)
    n = group_rules.document_len(doc, tokenizer)
    prompts = [qa_job.prompt_ids({"id": "x", "document": doc["document"], "question": q}, tokenizer)
               for q, _ in doc["facts"]]
    assert all(p[:n] == prompts[0][:n] for p in prompts) and len({p[n] for p in prompts}) > 1
    assert n > len(tokenizer(doc["document"])["input_ids"])  # the template's head and the whole document


def test_costs_count_the_shared_set_once_and_own_sets_each(tiny_dir):
    from spcli.config.scoring import ScoreConfig
    from spcli.plan.flops import prefill_flops, speculator_flops
    from spcli.stages.pays import shapes

    pair = shapes(tiny_dir, "self:2", None)
    score = ScoreConfig(lookahead=0, window=8, score_layers="1", pool=1, rows="mean")
    lengths = {"a": 600, "b": 600}
    own = [{"doc_id": d, "num_prompt_tokens": 620, "num_kept_tokens": 80} for d in "ab" for _ in range(3)]
    union = [{**r, "num_kept_tokens": 150 + 20} for r in own]  # 150 of the document kept, shared, and 20 own
    got_own = group_rules.costs(own, lengths, pair, score, "own")
    got_union = group_rules.costs(union, lengths, pair, score, "union")
    base, spec = pair
    full = prefill_flops(base, 660)
    assert got_own["cost"] == pytest.approx((speculator_flops(spec, 660, score) + 3 * prefill_flops(base, 80)) / full)
    assert got_union["cost"] == pytest.approx((speculator_flops(spec, 660, score) + prefill_flops(base, 210)) / full)
    assert got_own["base_tokens"] == pytest.approx(240 / 660) and got_union["base_tokens"] == pytest.approx(210 / 660)


def test_the_bench_runs_the_rules_and_saves_their_table(tmp_path, tiny_dir):
    """The tiny model: 2 documents x 2 questions, each question alone and under rule document (union, the default,
    is run by test_benches_qa_job), every row counted."""
    out = tmp_path / "res"
    group_rules.main(["--model", str(tiny_dir), "--docs", "2", "--questions", "2", "--length", "600", "--keep", "0.3",
                      "--max-tokens", "2", "--speculator", "self:2", "--dtype", "float32",
                      "--spcli-flags", "--lookahead 0 --max-prune-cost inf", "--rules", "own,document",
                      "--out", str(out)])
    saved = json.loads((out / "group_rules.json").read_text())["results"]
    by = {r["rule"]: r for r in saved}
    assert list(by) == ["own", "document"] and all(r["rows"] == 4 for r in saved)
    assert by["own"]["grouped"] == 0 and by["document"]["grouped"] == 4
    assert 0 < by["document"]["base_tokens"] < 1 and 0 < by["own"]["kept"] < 1
    assert "| 2 | document |" in (out / "group_rules.md").read_text()


def test_the_reference_is_plain_vllm_on_the_same_documents(tmp_path):
    """A qa_job.json made with other documents (fewer facts each: the same ids ask other facts) is no reference."""
    from argparse import Namespace

    def saved(name, questions, outputs):
        path = tmp_path / name
        path.write_text(json.dumps({"args": {"questions": questions, "length": 1200, "seed": 0}, "runs": [
            {"q": 4, "docs": 6, "name": "plain vLLM", "outputs": outputs},
            {"q": 4, "docs": 6, "name": "spcli vllm", "outputs": {}}]}))
        return str(path)

    other, same = saved("a.json", "4", {"doc0-q0": "x"}), saved("b.json", "1,4,10", {"doc0-q0": "y"})
    args = Namespace(questions="4,10", length=1200, seed=0)
    assert group_rules.reference_outputs(f"{other},{same}", 4, 6, args) == {"doc0-q0": "y"}
    assert group_rules.reference_outputs(other, 4, 6, args) is None
    assert group_rules.reference_outputs(same, 4, 2, args) is None and group_rules.reference_outputs(None, 4, 6, args) is None
