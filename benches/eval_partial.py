"""Summarise a partial `spcli eval` journal (OUT/examples.jsonl) with spcli's own summary, table and matched comparison;
writes OUT/partial_summary.json.    .venv/bin/python benches/eval_partial.py OUT
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from spcli.evaluate.summary import summarize
from spcli.evaluate.report import text_table
from spcli.evaluate.matched import compare_matched, matched_table

out = Path(sys.argv[1])
state = json.loads((out / "eval_state.json").read_text())
entries = [json.loads(l) for l in (out / "examples.jsonl").read_text().splitlines() if l.strip()]
rows = [r for e in entries for r in e["rows"]]
overlaps = [o for e in entries for o in e["overlaps"]]
summary = summarize(rows, overlaps, 2000, 0)
print(f"{len(entries)} examples: " + ", ".join(f"{t} {sum(e['rows'][0]['task'] == t for e in entries)}" for t in dict.fromkeys(e['rows'][0]['task'] for e in entries)))
print(text_table(summary, False))
matched = state.get("matched") or {}
if matched:
    print(matched_table(compare_matched(rows, matched, 2000, 0)))
json.dump({"summary": summary, "matched": compare_matched(rows, matched, 2000, 0) if matched else {}, "num_examples": len(entries)},
          open(out / "partial_summary.json", "w"), indent=1, allow_nan=True)
