"""Summarise a partial (or running) `spcli eval` journal, OUT/examples.jsonl, as `spcli eval` does at the end
(spcli.evaluate.run.journal_summary: no model is loaded); prints the tables, writes OUT/partial_summary.json.

    .venv/bin/python benches/eval_partial.py OUT
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from spcli.evaluate.matched import matched_table
from spcli.evaluate.report import text_table
from spcli.evaluate.run import journal_summary

out = Path(sys.argv[1])
res = journal_summary(out)
print(f"{res['num_examples']} examples: " + ", ".join(f"{t} {n}" for t, n in res["examples_by_task"].items()))
print(text_table(res["summary"], False))
if res["matched"]:
    print(matched_table(res["matched"]))
(out / "partial_summary.json").write_text(json.dumps(res, indent=1, allow_nan=True))
