"""Several questions about one document (spcli/stages/share.py, spcli/io/groups.py): groups fixed by the input,
one kept set per document (the union of its questions' selections), outputs independent of batching and resume."""

import pytest
import torch
from typer.testing import CliRunner

from spcli.cli import app
from spcli.config.run import FieldConfig
from spcli.io.groups import Whole, assign, own_rows
from spcli.io.read import read_from, read_records
from spcli.io.shards import Shard
from spcli.stages.request import PrunedRequest
from spcli.config.scoring import SelectConfig
from spcli.stages.share import Group, shared_len, unite, unite_document
from test_job_run import ARGS, read_outputs

DOCS = [" ".join(f"fact{d}-{j} holds value {(d * 31 + j) % 97}." for j in range(40)) for d in range(3)]
QUESTIONS = ["What value does fact{d}-3 hold?", "What value does fact{d}-17 hold?", "What value does fact{d}-30 hold?"]


def qa_rows(docs=DOCS, questions=QUESTIONS):
    return [{"id": f"d{d}q{q}", "doc_id": f"doc{d}", "prompt": doc, "question": question.format(d=d)}
            for d, doc in enumerate(docs) for q, question in enumerate(questions)]


def test_shared_len_and_unite():
    assert shared_len([[1, 2, 3, 4], [1, 2, 3, 9, 9], [1, 2, 3]]) == 3
    assert shared_len([[5, 1], [6, 1]]) == 0
    reqs = [PrunedRequest(f"r{i}", list(range(10 + i)), torch.tensor(kept), 4)
            for i, kept in enumerate([[0, 2, 7, 8, 9], [0, 3, 8, 9, 10], [0, 2, 5, 11]])]
    group = Group([0, 1, 2], "r0", shared_len=8)
    assert unite(group, reqs) == 5  # {0, 2, 3, 5, 7}
    assert [r.kept.tolist() for r in reqs] == [[0, 2, 3, 5, 7, 8, 9], [0, 2, 3, 5, 7, 8, 9, 10],
                                               [0, 2, 3, 5, 7, 8, 9, 10, 11]]  # each keeps all its own tokens


def test_unite_document_selects_once_from_the_questions_scores_together():
    """--group-rule document: one selection of the shared part (8 tokens, keep 0.5: 4, the first and last forced)
    from the questions' importance together: their max for rows max, their mean for rows mean."""
    select = SelectConfig(keep=0.5, chunk=1, keep_first=1, keep_last=1, min_tokens=1, min_free=0, unit="chunk")
    peaks = [{2: 0.9}, {5: 0.6, 3: 0.45}, {3: 0.5, 6: 0.1}]  # per question: position -> importance

    def requests():
        out = []
        for i, peak in enumerate(peaks):
            importance = torch.zeros(8 + i + 1)
            for k, v in peak.items():
                importance[k] = v
            r = PrunedRequest(f"r{i}", list(range(8 + i + 1)), torch.arange(8 + i + 1), 4, keep=0.5)
            r.importance = importance
            out.append(r)
        return out

    reqs = requests()
    assert unite_document(Group([0, 1, 2], "r0", shared_len=8, rule="document"), reqs, select, "max") == 4
    assert [r.kept.tolist() for r in reqs] == [[0, 2, 5, 7, 8], [0, 2, 5, 7, 8, 9], [0, 2, 5, 7, 8, 9, 10]]
    reqs = requests()
    unite_document(Group([0, 1, 2], "r0", shared_len=8, rule="document"), reqs, select, "mean")
    assert reqs[0].kept.tolist() == [0, 2, 3, 7, 8]  # mean: 3 (0.95 / 3) over 5 (0.6 / 3)


def test_groups_are_runs_of_one_key_cut_at_multiples_of_group_max(tmp_path, write_jsonl):
    rows = [{"prompt": "a"}] * 5 + [{"prompt": "b"}, {"prompt": "b", "question": "?"}, "not json", {"prompt": "b"}]
    shard = Shard(0, str(write_jsonl(rows)), "in")
    records = list(read_records(shard, FieldConfig(instruction="question"), 0))
    assert [[records[i].row for i in g] for g in assign(records, 4)] == [[0, 1, 2, 3], [4], [5, 6], [7], [8]]
    whole = Whole(iter(records), 4)
    assert [[r.row for r in whole.take(3)] for _ in range(4)] == [[0, 1, 2, 3], [4, 5, 6], [7, 8], []]


def test_a_resume_inside_a_group_reads_the_group_from_its_start(tmp_path, write_jsonl):
    shard = Shard(0, str(write_jsonl(qa_rows())), "in")
    fields = FieldConfig(instruction="question")
    records = list(read_from(shard, fields, 4, 1 << 20, group_max=16))
    assert [(r.row, r.is_context) for r in records][:3] == [(3, True), (4, False), (5, False)]  # d1q0 before d1q1
    assert [r.row for r in records if not r.is_context] == list(range(4, 9))
    assert [r.row for r in read_from(shard, fields, 4, 1 << 20)] == list(range(4, 9))  # groups off: as before
    batch = records[:3]
    assert [r.row for r in own_rows(batch, [r.row for r in batch])[0]] == [4, 5]


@pytest.fixture
def qa_file(write_jsonl):
    return write_jsonl(qa_rows())


def _run(tmp_path, tiny_dir, qa_file, name, *extra):
    out = tmp_path / name
    res = CliRunner().invoke(app, ["run", str(qa_file), "--out", str(out), "--model", str(tiny_dir),
                                   "--instruction-field", "question", "--pass-through", "doc_id", *ARGS, *extra])
    assert res.exit_code == 0, res.output
    return {r["id"]: r for r in read_outputs(out)}


def test_a_group_keeps_one_set_of_its_document_and_its_rows_do_not_depend_on_batches(tmp_path, tiny_dir, qa_file):
    one = _run(tmp_path, tiny_dir, qa_file, "b1", "--batch-size", "1", "--max-prune-cost", "inf")
    four = _run(tmp_path, tiny_dir, qa_file, "b4", "--batch-size", "4", "--max-prune-cost", "inf")
    alone = _run(tmp_path, tiny_dir, qa_file, "off", "--batch-size", "4", "--groups", "off", "--max-prune-cost", "inf")
    assert one.keys() == four.keys() == alone.keys()
    for row_id, r in one.items():
        assert {k: v for k, v in r.items() if not k.endswith("_s")} == {
            k: v for k, v in four[row_id].items() if not k.endswith("_s")}, row_id  # batching changes nothing
        assert r["group"] == f"d{row_id[1]}q0" and r["group_size"] == 3
        assert alone[row_id]["group"] is None
    for d in range(3):
        members = [one[f"d{d}q{q}"] for q in range(3)]
        singles = [alone[f"d{d}q{q}"] for q in range(3)]
        # every member keeps all of its own tokens after the document: below T, where none keeps a whole run to
        # its end, lies only the document
        tails = [_tail_start(m["kept_indices"], m["num_prompt_tokens"]) for m in members]
        t = min(tails)
        shared = [{k for k in m["kept_indices"] if k < t} for m in members]
        assert shared[0] == shared[1] == shared[2]  # one kept set of the document
        union = set().union(*({k for k in s["kept_indices"] if k < t} for s in singles))
        assert shared[0] == union and len(union) > 0  # the union of the questions' own selections
        assert all(len(m["kept_indices"]) >= len(s["kept_indices"]) for m, s in zip(members, singles))


def _tail_start(kept: list[int], n: int) -> int:
    """The first position of the run of kept positions that ends the prompt."""
    k = n
    kept_set = set(kept)
    while k - 1 in kept_set:
        k -= 1
    return k


def test_inspect_says_a_row_shared_its_document(tmp_path, tiny_dir, qa_file):
    _run(tmp_path, tiny_dir, qa_file, "g", "--batch-size", "4", "--max-prune-cost", "inf")
    res = CliRunner().invoke(app, ["inspect", str(tmp_path / "g"), "--id", "d1q2", "--plain"])
    assert res.exit_code == 0, res.output
    assert "document kept with 2 other questions (group d1q0)" in res.output.splitlines()[0]


def test_inspect_says_why_a_group_was_prefilled_whole(tmp_path, tiny_dir, qa_file):
    rows = _run(tmp_path, tiny_dir, qa_file, "w", "--batch-size", "4", "--max-prune-cost", "0.01")
    assert all(r["keep_rate"] == 1.0 and r["group_size"] == 3 for r in rows.values())  # nothing pays at 1%
    res = CliRunner().invoke(app, ["inspect", str(tmp_path / "w"), "--id", "d0q1", "--plain"])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[1] == ("prefilled whole with its group's 3 questions: pruning the group would not "
                                          "beat prefilling its document once (--max-prune-cost 0.01)")
    _run(tmp_path, tiny_dir, qa_file, "p", "--batch-size", "4", "--max-prune-cost", "inf")
    res = CliRunner().invoke(app, ["inspect", str(tmp_path / "p"), "--id", "d0q1", "--plain"])
    assert "prefilled whole" not in res.output  # pruned: no note


def test_each_group_reads_and_prefills_its_document_once_on_hf(tmp_path, tiny_dir, qa_file, monkeypatch):
    """The speculator prefills each group's document once (speculate_shared's prefix pass) and the hf base prefills
    each group's kept document once (shared_pass), 3 documents x 3 questions; the rows equal those made without."""
    from spcli.engines.hf import shared_pass
    from spcli.stages import speculate_shared

    calls = {"speculator": [], "base": []}

    def spy(module, name, key, length):
        real = getattr(module, name)

        def counted(*args, **kwargs):
            calls[key].append(length(*args))
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)

    spy(speculate_shared, "prefill_prefix", "speculator", lambda model, ids, *a: len(ids))
    spy(shared_pass, "prefill_shared", "base", lambda model, group, *a: int(group.shared.numel()))
    rows = _run(tmp_path, tiny_dir, qa_file, "counted", "--batch-size", "9", "--max-prune-cost", "inf")
    assert len(calls["speculator"]) == 3 and len(calls["base"]) == 3  # one of each per document
    for d, n_kept in enumerate(calls["base"]):
        members = [rows[f"d{d}q{q}"] for q in range(3)]
        assert n_kept == len(set.intersection(*(set(m["kept_indices"]) for m in members)) & set(range(calls["speculator"][d])))
    monkeypatch.undo()
    again = _run(tmp_path, tiny_dir, qa_file, "again", "--batch-size", "1", "--max-prune-cost", "inf")
    assert {k: r["output"] for k, r in rows.items()} == {k: r["output"] for k, r in again.items()}


def test_group_rule_document_keeps_one_selection_and_names_itself_in_the_fingerprint(tmp_path, tiny_dir, qa_file):
    """--group-rule document: every member keeps one set of the document, at one question's budget (so no more than
    the union keeps); the rule is part of the run's configuration: a union directory is not continued with it."""
    union = _run(tmp_path, tiny_dir, qa_file, "union", "--max-prune-cost", "inf")
    doc = _run(tmp_path, tiny_dir, qa_file, "doc", "--max-prune-cost", "inf", "--group-rule", "document")
    for d in range(3):
        members = [doc[f"d{d}q{q}"] for q in range(3)]
        t = min(_tail_start(m["kept_indices"], m["num_prompt_tokens"]) for m in members)
        shared = [{k for k in m["kept_indices"] if k < t} for m in members]
        assert shared[0] == shared[1] == shared[2] and shared[0]
        united = {k for k in union[f"d{d}q0"]["kept_indices"] if k < t}
        assert len(shared[0]) <= len(united)
        assert all(m["group_size"] == 3 for m in members)
    res = CliRunner().invoke(app, ["run", str(qa_file), "--out", str(tmp_path / "union"), "--model", str(tiny_dir),
                                   "--instruction-field", "question", "--pass-through", "doc_id", *ARGS,
                                   "--max-prune-cost", "inf", "--group-rule", "document"])
    assert res.exit_code != 0 and "(group_rule: 'union' -> 'document')" in str(res.exception), res.exception
