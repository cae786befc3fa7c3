"""essay-qa: the bundled questions are answerable from their essays, and the examples are seeded, sized and
hold the quote before the question."""

import re
from collections import Counter

import pytest

from spcli.evaluate.essay_qa import ANSWER_WITH, questions, quote_spans
from spcli.evaluate.tasks import essays_dir, generate, sentences
from spcli.models.files import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    return load_tokenizer(smollm2_dir)


def prompt_len(tokenizer, ex) -> int:
    return len(tokenizer.apply_chat_template(ex.messages, add_generation_prompt=True, tokenize=True, return_dict=False))


def essay_text(name: str) -> str:
    """The essay as tasks.sentences() reads it: the YC line dropped, whitespace collapsed."""
    text = (essays_dir() / name).read_text(encoding="utf-8", errors="replace")
    text = re.sub(r"Want to start a startup\?\s*Get funded by\s*Y Combinator\.", " ", text)
    return re.sub(r"\s+", " ", text).strip()


def test_every_quote_is_in_its_essay_and_every_answer_in_its_quote():
    qs = questions()
    assert len(qs) >= 60 and len({q.essay for q in qs}) >= 20
    assert len({q.question for q in qs}) == len(qs)
    kinds = Counter(q.kind for q in qs)
    assert set(kinds) <= set(ANSWER_WITH) and min(kinds["name"], kinds["phrase"]) >= 10
    for q in qs:
        assert essay_text(q.essay).count(q.quote) == 1, q.quote
        assert q.answers and all(a in q.quote for a in q.answers), q.question
        assert not any(a.lower() in q.question.lower() for a in q.answers), q.question  # the question gives nothing away
        assert len(q.answers[0].split()) <= 4


def test_quote_spans_point_at_the_quote_in_the_corpus():
    pool = sentences()
    for q, (first, last) in zip(questions(), quote_spans()):
        assert first <= last <= first + 2
        assert q.quote in " ".join(pool[first : last + 1])


def test_example_holds_the_quote_once_and_ends_with_the_question(tokenizer):
    for ex in generate("essay-qa", tokenizer, 1024, 4, seed=0):
        text = ex.messages[-1]["content"]
        (quote,) = ex.needles
        assert text.count(quote) == 1
        assert ex.protected == (ex.metadata["instruction"],) and text.endswith("\n\n" + ex.metadata["instruction"])
        assert ex.metadata["instruction"].endswith(" only.") and not ex.require_all
        assert all(a in quote for a in ex.answers)
        assert 0.97 * 1024 <= prompt_len(tokenizer, ex) <= 1.03 * 1024


def test_lengths_land_near_the_target(tokenizer):
    for length in (512, 4096):
        got = [prompt_len(tokenizer, ex) for ex in generate("essay-qa", tokenizer, length, 3, seed=5)]
        assert all(0.95 * length <= n <= 1.05 * length for n in got), (length, got)


def test_same_seed_same_examples_other_seed_others_and_no_question_twice(tokenizer):
    a = generate("essay-qa", tokenizer, 256, 24, seed=1)
    assert a == generate("essay-qa", tokenizer, 256, 24, seed=1)
    b = generate("essay-qa", tokenizer, 256, 24, seed=2)
    asked = [e.metadata["asked"] for e in a]
    assert len(set(asked)) == len(asked)  # unused questions remain: none is asked twice
    assert asked != [e.metadata["asked"] for e in b]
    depths = [e.metadata["depth"] for e in a]
    assert min(depths) < 0.3 and max(depths) > 0.7
