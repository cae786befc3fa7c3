"""Paired differences between selectors of one `spcli eval` journal (OUT/examples.jsonl, finished or running):
for every selector at every keep the reference also ran, accuracy minus the reference's on the same examples,
per task and over all tasks, mean [95% bootstrap CI]. No model is loaded.

    .venv/bin/python benches/eval_pairs.py OUT REFERENCE [--metric contains]

e.g. `benches/eval_pairs.py docs/results/qwen-eval specprefill@smollm2-135m`; writes OUT/pairs-REFERENCE.json.
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from spcli.evaluate.journal import read_journal
from spcli.evaluate.metrics import bootstrap
from spcli.evaluate.summary import TASK_METRIC, paired_differences


def paired_deltas(rows: list[dict], reference: str, metric: str = TASK_METRIC, seed: int = 0) -> list[dict]:
    """One entry per (selector, keep, task or "all"): metric(selector) - metric(reference), paired by example id."""
    ref = {(r["id"], r["keep"]): r for r in rows if r["selector"] == reference}
    if not ref:
        raise SystemExit(f"no rows of selector {reference!r} in the journal")
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r["selector"] != reference and (r["id"], r["keep"]) in ref:
            for task in (r["task"], "all"):
                groups[(r["selector"], r["keep"], task)].append(r)
    return [{"selector": s, "keep": k, "task": t,
             "delta": bootstrap(paired_differences(g, ref, lambda r: (r["id"], r["keep"]), metric), seed=seed).to_dict()}
            for (s, k, t), g in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2] == "all", kv[0][2]))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("reference")
    ap.add_argument("--metric", default=TASK_METRIC)
    args = ap.parse_args()
    _, done = read_journal(args.out)
    entries = paired_deltas([r for e in done.values() for r in e["rows"]], args.reference, args.metric)
    print(f"{len(done)} examples; {args.metric} minus {args.reference}'s on the same examples, mean [95% CI]")
    print(f"{'selector':<26} {'keep':>4}  {'task':<12} {'n':>3}  delta")
    for e in entries:
        d = e["delta"]
        print(f"{e['selector']:<26} {e['keep']:>4}  {e['task']:<12} {d['n']:>3}  {d['mean']:+.2f} [{d['lo']:+.2f}, {d['hi']:+.2f}]")
    (args.out / f"pairs-{args.reference}.json").write_text(json.dumps(entries, indent=1, allow_nan=True))


if __name__ == "__main__":
    main()
