"""Adaptive keep (auto:P) against a fixed keep at the same mean kept fraction, paired per example.

Before the main loop, every example's speculator pass is made once (and reused by it); each auto
policy's mean kept fraction f over all examples (SpecPrefill's importance, every task and length
pooled) becomes a fixed keep f of its own. Pooled matching spends the same prefill work on the whole
set either way, so a win of auto:P means it moved tokens to the prompts that needed them.
Differences are auto minus fixed on the same example, with 95% paired bootstrap intervals.
"""

from __future__ import annotations

import dataclasses

from spcli.evaluate.compare import example_signals, prompt_ids
from spcli.evaluate.config import EvalConfig, is_auto, policy_select
from spcli.evaluate.metrics import bootstrap
from spcli.evaluate.selectors import Signals, random_seed, select

SELECTOR = "specprefill"
DELTAS = (("acc", "contains"), ("1st-tok", "first_token"), ("EM16", "prefix_match"), ("KL", "kl"))
DIGITS = 3  # fixed keeps are rounded to this many decimals


def matched_keeps(m, examples, cfg: EvalConfig, log=print) -> tuple[dict[str, float], dict[str, Signals | None]]:
    """{auto policy: fixed keep at its mean kept fraction} and every example's speculator pass by id."""
    signals: dict[str, Signals | None] = {}
    fractions: dict[str, list[float]] = {k: [] for k in cfg.keeps if is_auto(k)}
    for i, ex in enumerate(examples):
        ids, _ = prompt_ids(m, ex, cfg)
        signals[ex.id] = example_signals(m, ex, ids, cfg)
        for policy, values in fractions.items():
            select_cfg, rate = policy_select(cfg.select, policy)
            kept = select(SELECTOR, len(ids), signals[ex.id], select_cfg, rate, random_seed(cfg.seed, ex.id))
            values.append(kept.numel() / len(ids))
        if (i + 1) % 8 == 0 or i + 1 == len(examples):
            log(f"speculator passes: {i + 1}/{len(examples)}")
    matched = {p: round(sum(v) / len(v), DIGITS) for p, v in fractions.items() if v}
    for p, keep in matched.items():
        log(f"{p} keeps {100 * keep:.1f}% of prompt tokens on average: fixed keep {keep} matches it")
    return matched, signals


def with_matched(cfg: EvalConfig, matched: dict[str, float]) -> EvalConfig:
    return dataclasses.replace(cfg, keeps=tuple(dict.fromkeys((*cfg.keeps, *matched.values()))))


def compare_matched(rows: list[dict], matched: dict[str, float], num_resamples: int = 2000, seed: int = 0) -> list[dict]:
    """Per auto policy, per task and over all tasks ("all"): kept fractions and paired differences auto - fixed."""
    by = {(r["id"], r["keep"]): r for r in rows if r["selector"] == SELECTOR}
    ci = lambda values: bootstrap(values, num_resamples, seed).to_dict()
    out = []
    for policy, fixed in matched.items():
        pairs = [(a, by[(a["id"], fixed)]) for (i, k), a in by.items() if k == policy and (i, fixed) in by]
        for task in [*dict.fromkeys(a["task"] for a, _ in pairs), "all"]:
            group = [(a, f) for a, f in pairs if task in ("all", a["task"])]
            diff = lambda key: ci([None if a[key] is None or f[key] is None else a[key] - f[key] for a, f in group])
            out.append({
                "policy": policy, "fixed": fixed, "task": task, "n": len(group),
                "kept_auto": ci([a["num_kept"] / a["num_prompt_tokens"] for a, _ in group]),
                "kept_fixed": ci([f["num_kept"] / f["num_prompt_tokens"] for _, f in group]),
                "auto": {key: ci([a[key] for a, _ in group]) for _, key in DELTAS},
                "fixed_metrics": {key: ci([f[key] for _, f in group]) for _, key in DELTAS},
                "delta": {key: diff(key) for _, key in DELTAS},
            })
    return out


def _fmt(c: dict, digits: int = 2, sign: bool = False) -> str:
    if not c or not c["n"]:
        return "-"
    f = f"{{:{'+' if sign else ''}.{digits}f}}"
    return f"{f.format(c['mean'])} [{f.format(c['lo'])},{f.format(c['hi'])}]"


def matched_table(entries: list[dict]) -> str:
    """Auto vs fixed at the same mean kept fraction: per task, means and paired differences (auto - fixed)."""
    if not entries:
        return ""
    head = ["policy", "task", "n", "kept% a/f"] + [f"{name} a/f" for name, _ in DELTAS] + [f"d{name}" for name, _ in DELTAS]
    rows = [head]
    for e in entries:
        digits = lambda key: 3 if key == "kl" else 2
        rows.append([f"{e['policy']} vs {e['fixed']}", e["task"], str(e["n"]),
                     f"{100 * e['kept_auto']['mean']:.1f}/{100 * e['kept_fixed']['mean']:.1f}"]
                    + [f"{e['auto'][k]['mean']:.{digits(k)}f}/{e['fixed_metrics'][k]['mean']:.{digits(k)}f}"
                       if e["auto"][k]["n"] else "-" for _, k in DELTAS]
                    + [_fmt(e["delta"][k], digits(k), sign=True) for _, k in DELTAS])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["adaptive vs fixed keep at the same mean kept fraction (specprefill; a = auto, f = fixed; "
             "d = auto - fixed, paired, mean [95% bootstrap CI])"]
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w) if j < 2 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
