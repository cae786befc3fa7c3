"""Documents with several facts and groups of questions about them, for benches/shared_docs_rules.py (issue 51).

A document is ~`doc_tokens` tokens of consecutive Paul Graham essay sentences (spcli.evaluate.tasks.Filler) with
`num_facts` fact sentences at random depths, each about its own thing and of one of the needles family's kinds
(spcli.evaluate.needles: an access code, a project lead's full name, a shipment date). Its questions, one per fact,
come in random order; a group of Q asks the first Q of them (so a random Q of the facts, in random order), and
question b's prompt is the chat template around INTRO + document + question b: the prompts share the template head
and the document. Seeded: the same arguments give the same documents.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from spcli.evaluate.needles import INTRO, MONTHS, _code
from spcli.evaluate.haystack import ADJECTIVES, FIRST, LAST, NOUNS, insert_at_depths
from spcli.evaluate.tasks import Example, Filler


@dataclass(frozen=True)
class Fact:
    sentence: str  # verbatim in the document
    question: str
    answers: tuple[str, ...]
    require_all: bool  # a date: month, day and year all needed (scored as the share found)


@dataclass(frozen=True)
class Doc:
    doc_id: str
    questions: list[Example]  # one per fact, in the order asked; each needle: its fact's sentence


def fact(rng: random.Random, thing: str) -> Fact:
    kind = rng.choice(("code", "name", "date"))
    if kind == "code":
        code = _code(rng)
        return Fact(f"The access code for the {thing} vault is {code}.",
                    f"What is the access code for the {thing} vault? Answer with the code only.", (code,), False)
    if kind == "name":
        name = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
        return Fact(f"The {thing} project is led by {name}.",
                    f"Who leads the {thing} project? Answer with the person's full name only.", (name,), False)
    month, day, year = rng.choice(MONTHS), rng.randrange(1, 29), rng.randrange(2024, 2031)
    return Fact(f"The {thing} shipment is due on {month} {day}, {year}.",
                f"On what date is the {thing} shipment due? Answer with the date only.",
                (month, str(day), str(year)), True)


def document(rng: random.Random, filler: Filler, doc_tokens: int, num_facts: int) -> tuple[str, list[Fact]]:
    """Essay text of ~doc_tokens tokens (facts included) and its facts, each about a different thing."""
    things = rng.sample([f"{a} {n}" for a in ADJECTIVES for n in NOUNS], num_facts)
    facts = [fact(rng, t) for t in things]
    room = doc_tokens - sum(filler.count(f.sentence) + 1 for f in facts)
    depths = [rng.uniform(0.05, 0.95) for _ in facts]
    text = " ".join(insert_at_depths(filler.take(rng, max(0, room)), [f.sentence for f in facts], depths))
    return text, facts


def documents(tokenizer, num_docs: int, num_facts: int, doc_tokens: int, seed: int, max_tokens: int = 24,
              first: int = 0) -> list[Doc]:
    """Documents first .. first + num_docs - 1 (each its own seed), each with its questions in random order."""
    filler = Filler(tokenizer)
    out = []
    for d in range(first, first + num_docs):
        rng = random.Random(f"shared-docs:{doc_tokens}:{num_facts}:{seed}:{d}")
        text, facts = document(rng, filler, doc_tokens, num_facts)
        order = rng.sample(range(num_facts), num_facts)
        out.append(Doc(f"doc{d}", [
            Example(f"doc{d}-fact{i}", "shared-docs",
                    messages=[{"role": "user", "content": f"{INTRO}\n\n{text}\n\n{facts[i].question}"}],
                    answers=facts[i].answers, require_all=facts[i].require_all, needles=(facts[i].sentence,),
                    max_tokens=max_tokens, metadata={"fact": i})
            for i in order]))
    return out
