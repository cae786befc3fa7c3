"""Per (task, selector, keep) means with 95% bootstrap intervals; differences paired per example
against full prefill and against SpecPrefill at the same keep rate."""

from __future__ import annotations

from collections import defaultdict

from spcli.evaluate.config import policy_order
from spcli.evaluate.metrics import bootstrap, bootstrap_ratio

METRICS = ("contains", "exact", "f1", "first_token", "prefix_match", "kl", "needle_kept",
           "cut_values")  # value words dropped right after a kept word, per row (absent from journals made before)
TASK_METRIC = "contains"  # "accuracy" in tables: exact/contains match, fraction found when all answers are required


def paired_differences(group: list[dict], reference: dict, key, metric: str = TASK_METRIC) -> list[float | None]:
    """Per row r of `group`: r[metric] minus that of its reference row `reference[key(r)]` (the same example);
    None where the reference has no such row or either value is None."""
    out = []
    for r in group:
        ref = reference.get(key(r))
        out.append(None if ref is None or r[metric] is None or ref[metric] is None else r[metric] - ref[metric])
    return out


def summarize(rows: list[dict], overlaps: list[dict], num_resamples: int = 2000, seed: int = 0) -> list[dict]:
    """One entry per (task, selector, keep), full prefill first; every number an Interval dict with n."""
    full = {r["id"]: r for r in rows if r["selector"] == "full"}
    spec = {(r["id"], r["keep"]): r for r in rows if r["selector"] == "specprefill"}
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["task"], r["selector"], r["keep"])].append(r)
    pairs: dict[tuple, list[float]] = defaultdict(list)
    for o in overlaps:
        pairs[(o["task"], o["a"], o["keep"], o["b"])].append(o["jaccard"])
        pairs[(o["task"], o["b"], o["keep"], o["a"])].append(o["jaccard"])

    ci = lambda values: bootstrap(values, num_resamples, seed).to_dict()
    out = []
    for (task, selector, keep), group in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] != "full", kv[0][1], policy_order(kv[0][2]))):
        refs = [full[r["id"]] for r in group]
        entry = {
            "task": task, "selector": selector, "keep": keep, "n": len(group),
            "num_over_budget": sum(bool(r.get("is_over_budget")) for r in group),  # forced tokens exceed the budget
            "kept_fraction": ci([r["num_kept"] / r["num_prompt_tokens"] for r in group]),
            "prompt_tokens": ci([r["num_prompt_tokens"] for r in group]),
            "metrics": {m: ci([r.get(m) for r in group]) for m in METRICS},
            "delta_vs_full": ci(paired_differences(group, full, lambda r: r["id"])),
            "delta_vs_specprefill": ci(paired_differences(group, spec, lambda r: (r["id"], r["keep"]))),
            "speedup": bootstrap_ratio([f["ttft_s"] for f in refs], [r["ttft_s"] for r in group], num_resamples, seed).to_dict(),
            "ttft_s": ci([r["ttft_s"] for r in group]),
            "overlap": {b: ci(v) for (t, a, k, b), v in pairs.items() if (t, a, k) == (task, selector, keep)},
        }
        out.append(entry)
    return out
