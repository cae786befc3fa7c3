"""Calibrate output: the (layer, setting) grid, a terminal table, results.json and calibrate.png (matplotlib Agg).

A setting is a (window, pool, rows, chunk) of spcli.calibrate.layers.Setting; results hold them as dicts (results
written before --rows have no rows: mean)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from spcli.config.scoring import PAPER_CHUNK, PAPER_SCORE

MARKERS = ("o", "s", "^", "v", "D", "x")


SETTING = ("window", "pool", "rows", "chunk")
METRIC_TEXT = {"facts": "mean fraction of fact sentences kept whole", "tokens": "mean fraction of fact tokens kept"}


def metric_of(results: dict) -> str:
    """The recall measure of a results.json (written before --metric: tokens)."""
    return results["config"].get("metric", "tokens")
TABLE_ALL_UP_TO = 3  # settings per layer printed in full; beyond, each layer's best (results.json has all)


def cell(recall: dict[str, np.ndarray], layer: int, i: int, keeps: tuple[float, ...]) -> dict[str, dict[str, float]]:
    """{task: {keep: mean recall}} of one (layer, setting index); recall[task] is [L, NS, NK]."""
    return {t: {str(keep): float(r[layer, i, k]) for k, keep in enumerate(keeps)} for t, r in recall.items()}


def grid(recall: dict[str, np.ndarray], costs: list[float], settings: list, keeps: tuple[float, ...],
         hold_out: tuple[str, ...] = ()) -> list[dict]:
    """One entry per (layer, setting), layers outer: recall per task and keep, the worst and mean of the tasks chosen on
    (all but `hold_out`), the worst of the held-out ones (`held_out_worst`), the layer's cost."""
    out = []
    for layer, cost in enumerate(costs):
        for i, s in enumerate(settings):
            c = cell(recall, layer, i, keeps)
            on = [v for t, per_keep in c.items() if t not in hold_out for v in per_keep.values()]
            held = [v for t, per_keep in c.items() if t in hold_out for v in per_keep.values() if not math.isnan(v)]
            worst = min((v for v in on if not math.isnan(v)), default=math.nan)
            mean = float(np.nanmean(on or [math.nan]))
            out.append({"layer": layer, "window": s.window, "pool": s.pool, "rows": s.rows, "chunk": s.chunk, "cost": cost,
                        "recall": c, "worst": worst, "mean": mean, "held_out_worst": min(held, default=math.nan)})
    return out


def task_worst(entry: dict) -> dict[str, float]:
    """{task: its lowest recall over the keeps} of one grid entry."""
    return {t: min((v for v in per_keep.values() if not math.isnan(v)), default=math.nan) for t, per_keep in entry["recall"].items()}


def against_current(results: dict) -> list[str]:
    """Lines: each task's worst recall at the choice and at the model's current setting (held-out tasks marked), and
    whether the choice is no worse on every task: the rule a preset changes by (issue 56)."""
    choice, current, held = results["choice"], results.get("current"), set(results.get("held_out", ()))
    entry = next(e for e in results["grid"] if _key(e) == _key(choice))
    now = None if current is None else next((e for e in results["grid"] if _key(e) == _key(current)), None)
    name = lambda t: f"{t} (held out)" if t in held else t
    lines = ["per task, worst over the keeps: " + ", ".join(
        f"{name(t)} {_num(v)}" + ("" if now is None else f" (current {_num(task_worst(now)[t])})")
        for t, v in task_worst(entry).items())]
    if now is None:
        lines.append("current setting: not in this sweep (sweep its window, pool, rows and chunk to compare)")
    else:
        worse = [t for t, v in task_worst(entry).items() if v < task_worst(now)[t]]
        lines.append(f"current setting: layer {now['layer']}, window {now['window']}, pool {now['pool']}, rows {now['rows']}, "
                     f"chunk {now['chunk']} (cost {now['cost']:.2f}); the choice is "
                     + ("no worse on every task" if not worse else "WORSE on " + ", ".join(name(t) for t in worse)))
    return lines


def _rank(e: dict) -> tuple:
    """The better entry sorts first: worst recall, then mean recall (NaN last)."""
    nan_low = lambda v: -1.0 if math.isnan(v) else v
    return (-nan_low(e["worst"]), -nan_low(e["mean"]))


def _key(e: dict) -> tuple:
    """An entry's or a choice's (layer, window, pool, rows, chunk)."""
    return tuple(e.get(k, "mean") for k in ("layer",) + SETTING)


def shortfalls(results: dict) -> list[str]:
    """task@keep (recall) where the choice's mean recall is below the target."""
    target, choice = results["config"]["target_recall"], results["choice"]
    entry = next(e for e in results["grid"] if _key(e) == _key(choice))
    return [f"{t}@{k} ({_num(v)})" for t, per_keep in entry["recall"].items() for k, v in per_keep.items()
            if not v >= target]


def shown(results: dict) -> list[dict]:
    """The table's rows: every entry for a few settings, else each layer's best plus the choice."""
    if len(results["settings"]) <= TABLE_ALL_UP_TO:
        return results["grid"]
    choice = _key(results["choice"])
    out = []
    for layer in range(len(results["costs"])):
        entries = [e for e in results["grid"] if e["layer"] == layer]
        best = sorted(entries, key=_rank)[0]
        out.append(best)
        chosen = [e for e in entries if _key(e) == choice and e is not best]
        out += chosen
    return out


def _num(v: float) -> str:
    return "-" if v is None or math.isnan(v) else f"{v:.2f}"


def text_table(results: dict) -> str:
    """layer, window, pool, rows, chunk, recall per task and keep, the worst of them, cost; the choice marked with *;
    then the choice, how it meets the target per task and keep, and its `spcli run` flags."""
    keeps, tasks, choice = [str(k) for k in results["keeps"]], results["tasks"], results["choice"]
    header = ["layer", *SETTING] + [f"{t}@{k}" for t in tasks for k in keeps] + ["worst", "cost"]
    rows = [header]
    for e in shown(results):
        mark = "*" if _key(e) == _key(choice) else ""
        rows.append([f"{mark}{e['layer']}"] + [str(e.get(k, "mean")) for k in SETTING]
                    + [_num(e["recall"][t][k]) for t in tasks for k in keeps] + [_num(e["worst"]), _num(e["cost"])])
    paper = results.get("paper")
    if paper:
        recall = [paper["recall"].get(t, {}).get(k, math.nan) for t in tasks for k in keeps]
        rows.append(["all", f"la{PAPER_SCORE['lookahead']}", str(PAPER_SCORE["pool"]), PAPER_SCORE["rows"], str(PAPER_CHUNK)]
                    + [_num(v) for v in recall]
                    + [_num(min(recall, default=math.nan)), _num(paper["cost"])])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    target, max_cost = results["config"]["target_recall"], choice.get("max_cost")
    if max_cost is None:
        verdict = (f"meets the target {target} on every task at every keep" if choice["meets_target"] else
                   f"is BELOW the target {target}: no configuration reaches it on every task at every keep; this one "
                   "has the best worst-case recall")
    else:
        budget = (f"the best worst-case recall at cost <= {max_cost:g}" if choice["cost"] <= max_cost else
                  f"OVER the budget {max_cost:g}: no layer is that cheap; the cheapest layer's best")
        short = shortfalls(results)
        verdict = f"{budget}; " + (f"meets the target {target} on every task at every keep" if not short else
                                   f"BELOW the target {target} at " + ", ".join(short))
    some = len(results["settings"]) > TABLE_ALL_UP_TO
    lines += ["", f"recall: {METRIC_TEXT[metric_of(results)]} per task and keep; worst: the lowest of them; cost: share of "
              "the full speculator forward up to that layer" + ("; all/la8: the paper's recipe (every layer, look-ahead 8, "
              "pool 13, chunk 32, cost relative to one full forward)" if paper else "")
              + ("; per layer its best setting and the choice (every setting in results.json)" if some else ""),
              f"choice: layer {choice['layer']}, window {choice['window']}, pool {choice['pool']}, rows "
              f"{choice.get('rows', 'mean')}, chunk {choice['chunk']} (cost {choice['cost']:.2f}, worst recall "
              f"{choice['worst']:.2f}) {verdict}"]
    if results.get("held_out"):
        lines.append("held out (measured, not chosen on): " + ", ".join(results["held_out"]))
    if "current" in results:
        lines += against_current(results)
    if results.get("run_flags"):
        lines.append(f"run it: {results['run_flags']}")
    return "\n".join(lines)


def write_json(path: Path, results: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=1, allow_nan=True))
    os.replace(tmp, path)


def plot(results: dict, path: Path) -> Path:
    """Per keep a panel: worst-task recall against layer, one line per setting, the target dashed, cost on a twin axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keeps, settings, costs = results["keeps"], results["settings"], results["costs"]
    layers = list(range(len(costs)))
    fig, axes = plt.subplots(1, len(keeps), figsize=(5.5 * len(keeps), 4), squeeze=False)
    for ax, keep in zip(axes[0], keeps):
        for i, s in enumerate(settings):
            worst = [min((e["recall"][t][str(keep)] for t in results["tasks"]), default=math.nan)
                     for e in results["grid"] if all(e.get(k, "mean") == s.get(k, "mean") for k in SETTING)]
            ax.plot(layers, worst, marker=MARKERS[i % len(MARKERS)], ms=3,
                    label=f"W{s['window']} pool {s['pool']} rows {s.get('rows', 'mean')} chunk {s['chunk']}"
                    if len(settings) > 1 else f"window {s['window']}")
        ax.axhline(results["config"]["target_recall"], color="k", ls="--", lw=1, label="target")
        choice = results["choice"]
        ax.axvline(choice["layer"], color="tab:red", ls=":", lw=1,
                   label=f"choice: layer {choice['layer']}, W{choice['window']} pool {choice['pool']} "
                         f"rows {choice.get('rows', 'mean')} chunk {choice['chunk']}")
        ax.set_xlabel("speculator layer (scoring alone)")
        ax.set_ylabel({"facts": "facts kept whole", "tokens": "fact-token recall"}[metric_of(results)] + " (worst task)")
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(f"keep {keep}")
        ax.grid(alpha=0.3)
        twin = ax.twinx()
        twin.plot(layers, costs, color="gray", lw=1, alpha=0.7)
        twin.set_ylabel("cost: share of the full forward", color="gray")
        twin.set_ylim(0, 1.05)
    axes[0][0].legend(fontsize=8, loc="lower right")
    fig.suptitle(f"calibrate: {results['speculator']} ({', '.join(results['tasks'])})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
