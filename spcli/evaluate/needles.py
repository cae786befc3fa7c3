"""The `needles` task family: facts worded as users' documents word them, where a cut in the wrong place
loses the answer (issue 30). Each buries one fact sentence in essay prose; the answer ends the sentence.

    needle-code   "The access code for the <adj> <noun> vault is <code>." a code of several tokens (digits, or
                  letters and digits with dashes) at the end of a sentence
    needle-name   "The <adj> <noun> project is led by <First Last>." a person's name
    needle-date   "The <adj> <noun> shipment is due on <Month D, YYYY>." a date (scored as the share of its
                  month, day and year in the answer)
    needle-first  the code of needle-code, with the question BEFORE the document and nothing after it: the
                  forced tail holds the document's end, not the question
    needle-facts  ten short facts of one document (4-digit codes and names, alternating; one in each tenth of it),
                  the question, after the notes and protected as an instruction field is, asks for one of them at
                  random: a document of benches/qa_job.py, what a selection must find among look-alike sentences

Builders follow spcli.evaluate.tasks: build(filler_tokens) -> messages, sized there by `_fit`.
"""

from __future__ import annotations

import random
import string

from spcli.evaluate.haystack import ADJECTIVES, FIRST, LAST, NOUNS, insert_at_depths

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
FAMILY = ("needle-code", "needle-name", "needle-date", "needle-first")


def _thing(rng: random.Random) -> str:
    return f"{rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}"


def _code(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return str(rng.randrange(100_000, 100_000_000))  # 6 to 8 digits
    letters = "".join(rng.choice(string.ascii_uppercase) for _ in range(2))
    return f"{letters}-{rng.randrange(1000, 10000)}-{rng.choice(string.ascii_uppercase)}"


def _buried(rng, filler, needle: str, frame):
    """build(num_tokens) for one needle at a random depth; frame(text) -> the user message."""
    depth, seed = rng.uniform(0.1, 0.9), rng.random()

    def build(num_tokens):
        text = " ".join(insert_at_depths(filler.take(random.Random(seed), num_tokens), [needle], [depth]))
        return [{"role": "user", "content": frame(text)}]

    return build, {"depth": depth}


INTRO = "Read the following notes carefully. I will ask you about them afterwards."


def _asked_after(rng, filler, needle: str, question: str):
    """build(num_tokens) for a needle in notes that the question follows."""
    return _buried(rng, filler, needle, lambda text: f"{INTRO}\n\n{text}\n\n{question}")


def needle_code(rng, filler, length, _):
    thing, code = _thing(rng), _code(rng)
    needle = f"The access code for the {thing} vault is {code}."
    build, meta = _asked_after(rng, filler, needle, f"What is the access code for the {thing} vault? Answer with the code only.")
    return build, (code,), (needle,), meta


def needle_name(rng, filler, length, _):
    thing, name = _thing(rng), f"{rng.choice(FIRST)} {rng.choice(LAST)}"
    needle = f"The {thing} project is led by {name}."
    build, meta = _asked_after(rng, filler, needle, f"Who leads the {thing} project? Answer with the person's full name only.")
    return build, (name,), (needle,), meta


def needle_date(rng, filler, length, _):
    thing = _thing(rng)
    month, day, year = rng.choice(MONTHS), rng.randrange(1, 29), rng.randrange(2024, 2031)
    needle = f"The {thing} shipment is due on {month} {day}, {year}."
    build, meta = _asked_after(rng, filler, needle, f"On what date is the {thing} shipment due? Answer with the date only.")
    return build, (month, str(day), str(year)), (needle,), meta


def needle_first(rng, filler, length, _):
    """The instruction (with the question) first: what a record's instruction field holds, so the example marks
    it protected (`spcli run --protect instruction`); `--variant protect=` selects as if it were not."""
    thing, code = _thing(rng), _code(rng)
    needle = f"The access code for the {thing} vault is {code}."
    instruction = (f"Answer the question about the notes below. Question: what is the access code for the {thing} "
                   "vault? Answer with the code only.")
    build, meta = _buried(rng, filler, needle, lambda text: f"{instruction}\n\nNotes:\n{text}")
    return build, (code,), (needle,), meta | {"instruction": instruction}


def short_fact(kind: str, thing: str, rng: random.Random) -> tuple[str, str, str]:
    """(sentence, question, answer) of one fact about `thing`, kind "code" (4 digits, so a small model's usual
    answer fits 16 tokens) or "name"; worded as needle-code and needle-name word them."""
    if kind == "code":
        code = str(rng.randrange(1000, 10000))
        return (f"The access code for the {thing} vault is {code}.",
                f"What is the access code for the {thing} vault? Answer with the code only.", code)
    name = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
    return (f"The {thing} project is led by {name}.",
            f"Who leads the {thing} project? Answer with the person's full name only.", name)


FACT_KINDS = ("code", "name")
NUM_FACTS = 10


def needle_facts(rng, filler, length, num_facts):
    things = rng.sample([f"{a} {n}" for a in ADJECTIVES for n in NOUNS], num_facts)
    facts = [short_fact(FACT_KINDS[i % len(FACT_KINDS)], t, rng) for i, t in enumerate(things)]
    depths = [0.05 + 0.9 * (i + rng.uniform(0.2, 0.8)) / num_facts for i in range(num_facts)]
    asked, seed = rng.randrange(num_facts), rng.random()
    sentence, question, answer = facts[asked]

    def build(num_tokens):
        text = " ".join(insert_at_depths(filler.take(random.Random(seed), num_tokens), [s for s, _, _ in facts], depths))
        return [{"role": "user", "content": f"{INTRO}\n\n{text}\n\n{question}"}]

    return build, (answer,), (sentence,), {"depths": depths, "asked": asked, "instruction": question}


BUILDERS = {  # task -> (builder, number of needles, max_tokens, all answers required): as tasks.BUILDERS
    "needle-code": (needle_code, 1, 40, False), "needle-name": (needle_name, 1, 40, False),
    "needle-date": (needle_date, 1, 40, True), "needle-first": (needle_first, 1, 40, False),
    "needle-facts": (needle_facts, NUM_FACTS, 24, False),
}
