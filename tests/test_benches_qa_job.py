"""benches/qa_job.py's own parts: the documents and their questions, the prompt plain vLLM is sent (the one spcli
reads), the order it is sent in, a real grouped `spcli run` read back, and the work and speed-ups (the whole bench
starts vLLM four times per Q: minutes here, run by hand)."""

from __future__ import annotations

import json
import sys
from argparse import Namespace

import pytest

from test_benches import REPO

sys.path.insert(0, str(REPO / "benches"))
import job  # noqa: E402
import qa_job  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from spcli.models.files import load_tokenizer

    return load_tokenizer(smollm2_dir)


@pytest.fixture(scope="module")
def docs(tokenizer):
    return [qa_job.make_document(tokenizer, d, 4, 600, 0) for d in range(3)]


def test_a_document_is_essay_prose_of_about_its_length_holding_every_fact_it_is_asked_about(tokenizer, docs):
    for doc in docs:
        assert len(doc["facts"]) == 4 and len({q for q, _ in doc["facts"]}) == 4
        for question, (answer,) in ((q, (a,)) for q, a in doc["facts"]):
            assert answer in doc["document"] and question.endswith("only.")
        assert abs(len(tokenizer(doc["document"])["input_ids"]) - 600) < 90  # within a sentence or two
    assert len({doc["document"] for doc in docs}) == 3
    assert qa_job.make_document(tokenizer, 1, 4, 600, 0) == docs[1]  # seeded


def test_the_shard_asks_each_document_in_turn_in_a_random_order_the_smaller_size_a_prefix(tmp_path, docs):
    small, large = tmp_path / "small.jsonl", tmp_path / "large.jsonl"
    answers = qa_job.write_shard(docs[:2], 3, 0, small)
    assert qa_job.write_shard(docs, 3, 0, large).items() >= answers.items()
    rows = [json.loads(line) for line in large.read_text().splitlines()]
    assert small.read_text().splitlines() == large.read_text().splitlines()[:6]
    assert [r["doc_id"] for r in rows] == ["doc0"] * 3 + ["doc1"] * 3 + ["doc2"] * 3
    for doc in docs:
        asked = [r["question"] for r in rows if r["doc_id"] == doc["doc_id"]]
        assert all(r["document"] == doc["document"] for r in rows if r["doc_id"] == doc["doc_id"])
        assert set(asked) <= {q for q, _ in doc["facts"]} and len(set(asked)) == 3
    orders = [[q for q, _ in doc["facts"]].index(r["question"]) for doc in docs
              for r in rows if r["doc_id"] == doc["doc_id"]]
    assert orders != sorted(orders)  # not the facts' order
    facts = {q: a for doc in docs for q, a in doc["facts"]}
    assert all(answers[r["id"]] == (facts[r["question"]],) for r in rows if r["id"] in answers) and len(answers) == 6


def test_plain_vllm_is_sent_the_prompt_spcli_reads(tmp_path, tokenizer, docs):
    from spcli.config.run import FieldConfig
    from spcli.io.records import to_record
    from spcli.io.shards import Shard
    from spcli.stages.tokenize import tokenize

    shard = tmp_path / "s.jsonl"
    qa_job.write_shard(docs[:1], 2, 0, shard)
    row = json.loads(shard.read_text().splitlines()[0])
    record = to_record(row, Shard(0, str(shard)), 0, "jsonl", FieldConfig(prompt="document", instruction="question"))
    ids = qa_job.prompt_ids(row, tokenizer)
    assert ids == tokenize(record, tokenizer, 1 << 30, "error")
    text = tokenizer.decode(ids)
    assert f"{row['document']}\n\n{row['question']}" in text and text.rstrip().endswith("assistant")


def test_every_documents_first_question_goes_first():
    rows = [{"doc_id": d} for d in ("a", "a", "a", "b", "c", "c")]
    assert qa_job.first_questions_first(rows) == ([0, 3, 4], [1, 2, 5])


def test_a_real_grouped_spcli_run_is_read_back(tmp_path, tiny_dir, docs):
    shard = tmp_path / "s.jsonl"
    answers = qa_job.write_shard(docs[:2], 2, 0, shard)
    args = Namespace(model=str(tiny_dir), keep=0.3, max_tokens=2, speculator="self:2", dtype="float32",
                     spcli_flags="--lookahead 0 --max-prune-cost inf")
    got = qa_job.run_spcli(shard, tmp_path / "out", args, "hf", None)
    assert sorted(got["outputs"]) == sorted(answers) and got["wall_s"] > 0
    assert got["grouped"] == 4 and 0 < got["kept"] < 1  # two documents, two questions each, pruned


def test_the_work_of_the_difference_and_the_speed_ups_of_the_fastest_repeats():
    answers = {"d0-q0": ("1234",), "d1-q0": ("Ines Rossi",)}
    said = {"d0-q0": "The code is 1234.", "d1-q0": "Hugo Sato"}
    runs = [{"name": job.PLAIN, "docs": 2, "wall_s": 100.0, "outputs": {}},
            {"name": job.PLAIN, "docs": 6, "wall_s": 180.0, "outputs": said},
            {"name": "spcli hf", "docs": 2, "wall_s": 50.0, "outputs": {}, "kept": 0.2, "grouped": 0},
            {"name": "spcli hf", "docs": 6, "wall_s": 70.0, "outputs": {**said, "d1-q0": "Ines Rossi"}, "kept": 0.25,
             "grouped": 2},
            {"name": job.PLAIN, "docs": 2, "wall_s": 130.0, "outputs": {}}]  # a second, slower repeat: not counted
    plain, hf = qa_job.summarize(runs, answers, (2, 6))
    assert plain["work_s"] == 80.0 and plain["speedup_work"] == 1.0 and plain["right"] == 1 and plain["agree"] == 2
    assert hf["work_s"] == 20.0 and hf["speedup_work"] == 4.0 and hf["speedup_job"] == 180 / 70
    assert hf["right"] == 2 and hf["agree"] == 1 and hf["grouped"] == 2
    text = qa_job.table([plain, hf], (2, 6))
    assert "| spcli hf | 50.0 | 70.0 | 20.0 | 4.00x | 2.57x | 2/2 | 1/2 | 25% | 2/2 |" in text
    assert "| plain vLLM | 100.0 | 180.0 | 80.0 | 1.00x | 1.00x | 1/2 | 2/2 | - | - |" in text
    slower = [*runs[:2], {**runs[2], "wall_s": 90.0}, {**runs[3], "wall_s": 85.0}]  # noise larger than the work
    assert qa_job.summarize(slower, answers, (2, 6))[1]["speedup_work"] is None


def test_main_runs_each_process_per_size_and_repeat_and_saves_the_tables(tmp_path, monkeypatch):
    calls = []

    def fake(shard, out, args, engine=None, root=None):
        ids = [json.loads(line)["id"] for line in shard.read_text().splitlines()]
        calls.append((engine, len(ids), out.name))
        return {"wall_s": 10.0 + len(ids) * (2.0 if engine is None else 1.0), "outputs": dict.fromkeys(ids, "x"),
                **({} if engine is None else {"kept": 0.5, "grouped": len(ids)})}

    monkeypatch.setattr(qa_job, "run_plain", fake)
    monkeypatch.setattr(qa_job, "run_spcli", fake)
    qa_job.main(["--docs", "1,2", "--questions", "2,3", "--length", "300", "--engines", "hf", "--repeat", "2",
                 "--out", str(tmp_path / "res")])
    assert [(e, n) for e, n, _ in calls] == [(None, 2), ("hf", 2), (None, 4), ("hf", 4)] * 2 + \
        [(None, 3), ("hf", 3), (None, 6), ("hf", 6)] * 2
    assert len({name for _, _, name in calls}) == len(calls)  # every run its own output folder
    saved = json.loads((tmp_path / "res" / "qa_job.json").read_text())
    assert sorted(saved["tables"]) == ["2", "3"] and len(saved["runs"]) == 16
    (plain, hf) = saved["tables"]["3"]
    assert hf["work_s"] == 3.0 and plain["work_s"] == 6.0 and hf["speedup_work"] == 2.0 and hf["grouped"] == 6
    text = (tmp_path / "res" / "qa_job.md").read_text()
    assert "Q=3 questions per document" in text and "best of 2" in text
    assert "| spcli hf | 13.0 | 16.0 | 3.0 | 2.00x | 1.38x | 0/6 | 6/6 | 50% | 6/6 |" in text


@pytest.mark.parametrize("shape", ["inline", "long", "bare"])
def test_facts_of_other_shapes_sit_inside_running_sentences(tokenizer, shape):
    """--shape inline/long/bare (issue 56's held-out shape and its kin): each fact is inside a sentence of the prose,
    its answer in the document once; bare has no sentence punctuation left."""
    doc = qa_job.make_document(tokenizer, 0, 4, 600, 0, shape)
    assert doc == qa_job.make_document(tokenizer, 0, 4, 600, 0, shape)  # seeded
    text = doc["document"]
    for question, answer in doc["facts"]:
        assert text.count(answer) == 1 and question.endswith("only.")
        at = text.index(answer) + len(answer)
        if shape == "inline":
            assert text[at : at + 2] == ". " and text[at + 2].islower()  # no sentence break for Bling Fire
        if shape == "long":
            assert text[at] == ","
    if shape == "bare":
        assert not any(c in text.split("\n\n", 1)[1] for c in ";!?") and ". " not in text.split("\n\n", 1)[1]
