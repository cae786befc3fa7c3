"""Fact shapes: the same kind of facts (codes, names, dates, in several wordings) set into documents the way real
reports, contracts and notes hold them (issue 56), so that settings are chosen on several shapes and checked on
one they were not chosen on (`spcli calibrate --hold-out`).

    facts-inline   four facts, each set between two words of a running sentence at a random word: no sentence
                   break before it, and ". " before the lower-case rest of the sentence after it
    facts-long     four facts, each a clause of a long sentence, between commas, with no full stop of its own
    facts-list     four facts as items of bulleted lists ("- the ferry to Halden: pier 4365"), among look-alike
                   items, in prose
    facts-table    a Markdown table of look-alike rows (item, code, owner, date) in prose; one cell asked
    facts-bare     facts-inline's documents with no sentence punctuation at all (every . ! ? ; removed)

Each asks one of its facts, after the document, and marks the question protected as an instruction field is.
Builders follow spcli.evaluate.tasks: build(filler_tokens) -> messages, sized there by `_fit`.
"""

from __future__ import annotations

import random
import re

from spcli.evaluate.haystack import ADJECTIVES, FIRST, LAST, NOUNS
from spcli.evaluate.needles import INTRO, MONTHS

NUM_FACTS = 4
PLACES = ("Halden", "Bergen", "Tromso", "Skagen", "Visby", "Lulea", "Kalmar", "Oulu", "Rauma", "Aarhus", "Odense", "Narvik")

# (kind, fact, question): {t} a thing, {v} the value; the question asks for the value alone
WORDINGS = (
    ("code", "the access code for the {t} vault is {v}", "What is the access code for the {t} vault?"),
    ("code", "the serial number of the {t} is {v}", "What is the serial number of the {t}?"),
    ("code", "the ferry to {p} leaves from pier {v}", "From which pier does the ferry to {p} leave?"),
    ("code", "the {t} team keeps its tools in locker {v}", "In which locker does the {t} team keep its tools?"),
    ("name", "the {t} project is led by {v}", "Who leads the {t} project?"),
    ("name", "the keys to the {t} are held by {v}", "Who holds the keys to the {t}?"),
    ("name", "the {t} account is managed by {v}", "Who manages the {t} account?"),
    ("date", "the {t} shipment is due on {v}", "On what date is the {t} shipment due?"),
    ("date", "the lease of the {t} ends on {v}", "On what date does the lease of the {t} end?"),
)
ANSWER_WITH = {"code": "Answer with the number only.", "name": "Answer with the person's full name only.",
               "date": "Answer with the date only."}


def _value(kind: str, rng: random.Random) -> str:
    if kind == "code":
        return str(rng.randrange(100, 1_000_000))
    if kind == "name":
        return f"{rng.choice(FIRST)} {rng.choice(LAST)}"
    return f"{rng.choice(MONTHS)} {rng.randrange(1, 29)}, {rng.randrange(2024, 2031)}"


def make_facts(rng: random.Random, num: int, exclude: list[dict] = ()) -> list[dict]:
    """`num` facts of distinct things (none of `exclude`'s), wordings distinct while there are enough: {"kind",
    "text" (lower-case, no full stop), "question", "value", "thing", "place"}."""
    taken = {f["thing"] for f in exclude}
    things = rng.sample([f"{a} {n}" for a in ADJECTIVES for n in NOUNS if f"{a} {n}" not in taken], num)
    places = [rng.choice([p for p in PLACES if p not in {f["place"] for f in exclude}]) for _ in range(num)]
    wordings = rng.sample(WORDINGS, min(num, len(WORDINGS))) + [rng.choice(WORDINGS) for _ in range(num - len(WORDINGS))]
    out = []
    for thing, place, (kind, fact, question) in zip(things, places, wordings):
        value = _value(kind, rng)
        out.append({"kind": kind, "text": fact.format(t=thing, p=place, v=value), "value": value,
                    "question": f"{question.format(t=thing, p=place)} {ANSWER_WITH[kind]}", "thing": thing,
                    "place": place if "{p}" in fact else None})
    return out


class Placement:
    """How a fact goes into a sentence of prose: place(sentence, fact, rng) -> sentence; set_as(fact): the fact's
    text as it then stands in the document (the needle)."""

    def __init__(self, joiner: str, after: str, lower_rest: bool):
        self.joiner, self.after, self.lower_rest = joiner, after, lower_rest

    def set_as(self, fact: str) -> str:
        return fact + self.after

    def __call__(self, sentence: str, fact: str, rng: random.Random) -> str:
        words = sentence.split(" ")
        cut = rng.randrange(1, len(words)) if len(words) > 1 else 1
        rest = words[cut:]
        if rest and self.lower_rest:
            rest[0] = rest[0][:1].lower() + rest[0][1:]
        return " ".join(words[:cut] + [self.joiner + self.set_as(fact)] + rest)


inline = Placement("", ".", True)  # "... know better than everyone around you, the ferry to Halden leaves from pier 436580. and a fool later"
in_long = Placement("and ", ",", False)  # "... around you, and the ferry to Halden leaves from pier 436580, a fool later"


def _prose_with(rng, filler, facts, place):
    """build(num_tokens) for prose with each fact set into one sentence by `place` (one fact a slice)."""
    depths = [0.05 + 0.8 * (i + rng.uniform(0.2, 0.8)) / len(facts) for i in range(len(facts))]  # out of the forced tail
    seed = rng.random()

    def build(num_tokens):
        src = random.Random(seed)
        prose = filler.take(random.Random(seed), num_tokens)
        for fact, depth in zip(facts, depths):
            i = min(len(prose) - 1, int(depth * len(prose)))
            prose[i] = place(prose[i], fact["text"], src)
        return " ".join(prose)

    return build, [place.set_as(f["text"]) for f in facts]


def _asked(rng, facts, body_of):
    asked = rng.randrange(len(facts))
    question = facts[asked]["question"]

    def build(num_tokens):
        return [{"role": "user", "content": f"{INTRO}\n\n{body_of(num_tokens)}\n\n{question}"}]

    return build, asked, question


def _in_prose(place: Placement, bare: bool = False):
    """The builder of NUM_FACTS facts set into prose by `place`, one asked; `bare`: every sentence mark then removed."""

    def builder(rng, filler, length, _):
        facts = make_facts(rng, NUM_FACTS)
        body, needles = _prose_with(rng, filler, facts, place)
        text = (lambda num_tokens: strip_marks(body(num_tokens))) if bare else body
        build, asked, question = _asked(rng, facts, text)
        return _result(build, facts, asked, question, [strip_marks(n) for n in needles] if bare else needles)

    return builder


facts_inline, facts_long, facts_bare = _in_prose(inline), _in_prose(in_long), _in_prose(inline, bare=True)


def strip_marks(text: str) -> str:
    """The text without sentence punctuation: every ! ? ; removed, and every . but a decimal point's."""
    return re.sub(r"[!?;]|\.(?!\d)", "", text)


def facts_list(rng, filler, length, _):
    """Facts as list items among look-alikes of the same wordings: "- <subject>: <value>"."""
    facts = make_facts(rng, NUM_FACTS)
    decoys = make_facts(random.Random(rng.random()), 3 * NUM_FACTS, exclude=facts)
    items = [f"- {_item(f)}" for f in facts]
    body, _ = _prose_with(rng, filler, [], inline)
    order = rng.sample(range(len(items) + len(decoys)), len(items) + len(decoys))
    lines = [items[i] if i < len(items) else f"- {_item(decoys[i - len(items)])}" for i in order]
    lists = [lines[k::3] for k in range(3)]

    def text(num_tokens):
        prose = body(max(0, num_tokens - sum(filler.count(line) + 1 for line in lines))).split(". ")
        for k, chunk in enumerate(lists):
            at = min(len(prose), round((k + 0.5) * len(prose) / 3)) + k
            prose.insert(at, "\n" + "\n".join(chunk) + "\n")
        return ". ".join(prose)

    build, asked, question = _asked(rng, facts, text)
    return _result(build, facts, asked, question, items)


def _item(fact: dict) -> str:
    """A fact as a list item: its wording's subject, a colon, the value ("the ferry to Halden leaves from pier: 436")."""
    text, value = fact["text"], fact["value"]
    subject = text[: text.rindex(value)].rstrip()
    for tail in (" is", " are", " ends on", " is due on", " is led by", " are held by", " is managed by"):
        if subject.endswith(tail):
            subject = subject[: -len(tail)]
            break
    return f"{subject}: {value}"


def facts_table(rng, filler, length, _):
    """A Markdown table of look-alike rows in prose; the question asks one cell of one row."""
    num_rows = 12
    things = rng.sample([f"{a} {n}" for a in ADJECTIVES for n in NOUNS], num_rows)
    rows = [(t, str(rng.randrange(100, 1_000_000)), f"{rng.choice(FIRST)} {rng.choice(LAST)}", _value("date", rng))
            for t in things]
    lines = ["| item | code | owner | due |", "|---|---|---|---|"] + [f"| {t} | {c} | {o} | {d} |" for t, c, o, d in rows]
    table = "\n".join(lines)
    r, column = rng.randrange(num_rows), rng.choice((1, 2, 3))
    kind = ("code", "name", "date")[column - 1]
    question = {1: f"What is the code of the {rows[r][0]} in the table?", 2: f"Who is the owner of the {rows[r][0]} in the table?",
                3: f"When is the {rows[r][0]} due, by the table?"}[column] + " " + ANSWER_WITH[kind]
    body, _ = _prose_with(rng, filler, [], inline)
    depth = rng.uniform(0.2, 0.8)

    def text(num_tokens):
        prose = body(max(0, num_tokens - filler.count(table))).split(". ")
        at = round(depth * len(prose))
        return ". ".join(prose[:at]) + ".\n\n" + table + "\n\n" + ". ".join(prose[at:])

    def build(num_tokens):
        return [{"role": "user", "content": f"{INTRO}\n\n{text(num_tokens)}\n\n{question}"}]

    return build, (rows[r][column],), (lines[2 + r],), {"asked": r, "column": column, "instruction": question, "kind": kind}


def _result(build, facts, asked, question, needles):
    fact = facts[asked]
    return build, (fact["value"],), (needles[asked],), {"asked": asked, "instruction": question, "kind": fact["kind"]}


BUILDERS = {  # task -> (builder, number of needles, max_tokens, all answers required): as tasks.BUILDERS
    "facts-inline": (facts_inline, NUM_FACTS, 24, False), "facts-long": (facts_long, NUM_FACTS, 24, False),
    "facts-list": (facts_list, NUM_FACTS, 24, False), "facts-table": (facts_table, 1, 24, False),
    "facts-bare": (facts_bare, NUM_FACTS, 24, False),
}
SHAPES = tuple(BUILDERS)
