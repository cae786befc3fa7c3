"""Write the demo inputs: examples/docs.jsonl (chat messages) and examples/docs.parquet (prompts).

Each document is a few hundred sentences of plain report prose with one fact buried in the middle;
the question at the end asks for it. Deterministic: rerunning gives the same files.
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


if __name__ == "__main__":
    main()
