"""Paired differences between selectors of one `spcli eval` journal (OUT/examples.jsonl, finished or running):
for every selector at every keep the reference also ran, accuracy minus the reference's on the same examples,
per task and over all tasks, mean [95% bootstrap CI]. No model is loaded.

    .venv/bin/python benches/eval_pairs.py OUT REFERENCE [--metric contains] [--with OTHER[=LABEL] ...]

e.g. `benches/eval_pairs.py docs/results/qwen-eval specprefill@smollm2-135m`; writes OUT/pairs-REFERENCE.json.
REFERENCE `full` pairs every selector at every keep with full prefill on the same example.
`--with OTHER=LABEL` adds the selectors of another eval's journal over the same examples (the same task, length,
seed and model: ids and prompt lengths must agree) as LABEL:SELECTOR, so that a later eval pairs with an earlier one;
then the file is OUT/pairs-REFERENCE+LABEL.json.
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from spcli.evaluate.journal import journal_rows, read_journal
from spcli.evaluate.metrics import bootstrap
from spcli.evaluate.summary import TASK_METRIC, paired_differences


FULL = "full"  # full prefill's rows: every other keep pairs with them by example


def paired_deltas(rows: list[dict], reference: str, metric: str = TASK_METRIC, seed: int = 0) -> list[dict]:
    """One entry per (selector, keep, task or "all"): metric(selector) - metric(reference), paired by example id."""
    key = (lambda r: r["id"]) if reference == FULL else (lambda r: (r["id"], r["keep"]))  # full runs at keep 1 only
    ref = {key(r): r for r in rows if r["selector"] == reference}
    if not ref:
        raise SystemExit(f"no rows of selector {reference!r} in the journal")
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r["selector"] != reference and key(r) in ref:
            for task in (r["task"], "all"):
                groups[(r["selector"], r["keep"], task)].append(r)
    return [{"selector": s, "keep": k, "task": t,
             "delta": bootstrap(paired_differences(g, ref, key, metric), seed=seed).to_dict()}
            for (s, k, t), g in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2] == "all", kv[0][2]))]


def merge_journal(rows: list[dict], other: list[dict], label: str) -> list[dict]:
    """rows plus other's non-full rows renamed LABEL:SELECTOR, on the examples both hold; an id whose prompt has
    another length in `other` is another example (another model or data set) and is refused."""
    lengths = {r["id"]: r["num_prompt_tokens"] for r in rows}
    for r in other:
        if r["id"] in lengths and lengths[r["id"]] != r["num_prompt_tokens"]:
            raise SystemExit(f"{label}: example {r['id']} has {r['num_prompt_tokens']} prompt tokens there and "
                             f"{lengths[r['id']]} here: not the same examples (same tasks, lengths, seed and model?)")
    return rows + [{**r, "selector": f"{label}:{r['selector']}"} for r in other
                   if r["selector"] != "full" and r["id"] in lengths]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("reference")
    ap.add_argument("--metric", default=TASK_METRIC)
    ap.add_argument("--with", dest="others", action="append", default=[], metavar="OTHER[=LABEL]",
                    help="another eval's journal over the same examples; its selectors become LABEL:SELECTOR")
    args = ap.parse_args()
    _, done = read_journal(args.out)
    rows, labels = journal_rows(done), []
    for other in args.others:
        path, _, label = other.partition("=")
        label = label or Path(path).name
        _, more = read_journal(Path(path))
        rows = merge_journal(rows, journal_rows(more), label)
        if label not in labels:
            labels.append(label)
    entries = paired_deltas(rows, args.reference, args.metric)
    print(f"{len(done)} examples; {args.metric} minus {args.reference}'s on the same examples, mean [95% CI]")
    print(f"{'selector':<26} {'keep':>4}  {'task':<12} {'n':>3}  delta")
    for e in entries:
        d = e["delta"]
        print(f"{e['selector']:<26} {e['keep']:>4}  {e['task']:<12} {d['n']:>3}  {d['mean']:+.2f} [{d['lo']:+.2f}, {d['hi']:+.2f}]")
    (args.out / f"pairs-{'+'.join([args.reference, *labels])}.json").write_text(json.dumps(entries, indent=1, allow_nan=True))


if __name__ == "__main__":
    main()
