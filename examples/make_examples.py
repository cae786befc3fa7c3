"""Write the example inputs: examples/docs.jsonl (chat messages) and examples/docs.parquet (prompts), the demo's;
examples/tickets.parquet, the README's "Your own data" job.

Each document is a few hundred sentences of plain report prose with one fact buried in the middle;
the question at the end asks for it. Each ticket is a support thread of ~900 tokens (SmolLM2's) with one fact
in the middle and a `question` column asking for it (`--instruction-field question`). Deterministic: rerunning
gives the same files.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SUBJECTS = ["The river survey team", "The county library board", "A local bakery cooperative", "The harbour authority",
            "The school gardening club", "The regional bus company", "A volunteer fire brigade", "The museum archive staff"]
VERBS = ["reviewed", "discussed", "measured", "reported on", "planned", "postponed", "compared", "documented"]
OBJECTS = ["the spring water levels", "the budget for next year", "the new opening hours", "repairs to the old bridge",
           "the delivery schedule", "volunteer training", "the winter timetable", "the inventory of donated books"]
TAILS = ["after a long meeting.", "with some disagreement.", "and agreed to revisit it in autumn.",
         "using figures from last season.", "at the request of several residents.", "without any firm conclusion.",
         "and published a short note.", "before the holiday weekend."]
FACTS = [
    ("the access code for the east storage room", "4417"),
    ("the name of the ferry captain", "Marguerite Oduya"),
    ("the colour of the new library door", "teal"),
    ("the number of bicycles in the station rack", "thirty-eight"),
]


TICKET_FACTS = [
    ("What is the customer's order number?", "My order number is 58213.", "58213"),
    ("Which city should the parcel go to?", "The parcel should go to Rotterdam.", "Rotterdam"),
    ("What colour is the damaged kettle?", "The kettle that arrived cracked is the green one.", "green"),
    ("Who approved the return?", "My manager, Priya Natarajan, approved the return.", "Priya"),
    ("On which day is the customer away?", "I will be away on Thursday, so please do not deliver then.", "Thursday"),
    ("How many chairs were ordered?", "We ordered twelve chairs for the meeting room.", "twelve"),
]
TICKET_FILLER = [
    "Thanks for getting back to me so quickly last time.", "I have attached the screenshots from the checkout page.",
    "The tracking page still shows the same status as yesterday.", "Our team uses the account for office supplies.",
    "I tried logging out and in again, and cleared the browser cache.", "The confirmation email arrived as expected.",
    "Could you check whether the warehouse has an update?", "We have been customers for several years now.",
    "The invoice address is the same as on the previous orders.", "I called the hotline but the queue was long.",
    "Please let me know if you need any more details from our side.", "The delivery note was inside the box."]


def tickets(sentences: int = 40) -> pa.Table:
    """Six support threads: a greeting, `sentences` filler sentences, the fact, as many more, a signature."""
    rng = random.Random(11)
    rows = []
    for i, (question, fact, answer) in enumerate(TICKET_FACTS):
        before, after = (" ".join(rng.choice(TICKET_FILLER) for _ in range(sentences)) for _ in range(2))
        rows.append({"ticket_id": f"T-{1040 + i}", "body": f"Hello support team,\n\n{before} {fact} {after}\n\n"
                     "Best regards,\nAlex", "question": f"{question} Answer in a few words.", "answer": answer})
    return pa.Table.from_pylist(rows)


def document(rng: random.Random, num_sentences: int, fact: tuple[str, str]) -> str:
    sentences = [f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(TAILS)}"
                 for _ in range(num_sentences)]
    what, value = fact
    sentences.insert(num_sentences // 2, f"Please remember that {what} is {value}.")
    return " ".join(sentences)


def main() -> None:
    rng = random.Random(7)
    here = Path(__file__).parent
    rows = []
    for i, fact in enumerate(FACTS):
        doc = document(rng, 60 + 25 * i, fact)
        question = f"According to the report, what is {fact[0]}? Answer briefly."
        rows.append({"id": f"doc-{i}", "doc": doc, "question": question, "answer": fact[1]})
    with open(here / "docs.jsonl", "w") as f:
        for r in rows:
            messages = [{"role": "user", "content": f"Read this report.\n\n{r['doc']}\n\n{r['question']}"}]
            f.write(json.dumps({"id": r["id"], "messages": messages, "answer": r["answer"]}) + "\n")
    table = pa.table({
        "id": [r["id"] + "-raw" for r in rows],
        "prompt": [f"Report: {r['doc']}\n\nQuestion: {r['question']}\nAnswer:" for r in rows],
        "answer": [r["answer"] for r in rows],
    })
    pq.write_table(table, here / "docs.parquet")
    pq.write_table(tickets(), here / "tickets.parquet")


if __name__ == "__main__":
    main()
