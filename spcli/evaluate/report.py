"""Eval output: a terminal table, results.json, PNG plots (matplotlib Agg) and an optional HTML page."""

from __future__ import annotations

import base64
import html
import json
import math
import os
from pathlib import Path

from spcli.evaluate.config import is_auto, policy_label
from spcli.evaluate.summary import TASK_METRIC

COLUMNS = (  # header, how to read it from a summary entry[, digits]
    ("acc", lambda e: e["metrics"][TASK_METRIC]),
    ("acc-full", lambda e: e["delta_vs_full"]),
    ("acc-spec", lambda e: e["delta_vs_specprefill"] if e["selector"] not in ("full", "specprefill") else None),
    ("1st-tok", lambda e: e["metrics"]["first_token"]),
    ("EM16", lambda e: e["metrics"]["prefix_match"]),
    ("KL", lambda e: e["metrics"]["kl"], 3),
    ("needle kept", lambda e: e["metrics"]["needle_kept"]),
    ("overlap/spec", lambda e: e["overlap"].get("specprefill")),
    ("cut/row", lambda e: e["metrics"].get("cut_values")),
    ("speedup", lambda e: e["speedup"]),
)


# The terminal table (fits 120 columns): CIs for accuracy and its paired difference, means for the rest;
# every column with its CI is in results.json, report.html and markdown_table.
COMPACT = ("acc", "acc-full", "EM16", "KL", "needle kept", "overlap/spec", "speedup")
SHORT = {"needle kept": "needle", "overlap/spec": "overlap", "speedup": "speedup*"}
MIN_N = 30  # fewer examples per row: bootstrap CIs are too rough to compare selectors by
COLUMN_HELP = (  # docs/guide/eval.md and `spcli eval --help` explain the columns in these words
    ("selector", "how tokens were chosen: full (full prefill, the reference), specprefill, random, recency, "
                 "sink-recency, self-information"),
    ("keep", "the keep rate asked for, or auto:P (keep auto with keep_scale P)"), ("n", "examples in the row"),
    ("kept%", "prompt tokens actually kept (forced first/last tokens included)"),
    ("acc", "task accuracy: the answer found in the output (all answers, when several are required)"),
    ("acc-full", "paired difference of acc against full prefill on the same examples (0 = as good)"),
    ("acc-spec", "paired difference against specprefill at the same keep (results.json / HTML only)"),
    ("1st-tok", "first generated token equals full prefill's (results.json / HTML only)"),
    ("EM16", "the first --compare-tokens greedy tokens equal full prefill's"),
    ("KL", "KL divergence of the first-token distribution from full prefill's (0 = identical)"),
    ("needle", "fraction of the needle's tokens kept (built-in tasks)"),
    ("cut/row", "numbers, codes, dates and names dropped right after a kept word, per row: a fact cut from its "
                "subject (results.json / HTML only)"),
    ("overlap", "Jaccard overlap of the kept set with specprefill's at the same keep"),
    ("speedup", "full-prefill TTFT / this selector's TTFT (speculator included), estimated from this eval's stage "
                "times (marked speedup* in the table; spcli bench measures it)"),
)

MARKERS = ("o", "s", "^", "v", "D", "x")
STYLES = ("-", "--", "-.", ":", "-", "--")


def fmt(ci: dict | None, digits: int = 2) -> str:
    if not ci or ci["n"] == 0 or ci["mean"] is None or math.isnan(ci["mean"]):
        return "-"
    return f"{ci['mean']:.{digits}f} [{ci['lo']:.{digits}f},{ci['hi']:.{digits}f}]"


def table_rows(summary: list[dict], task: str, compact: bool = False) -> list[list[str]]:
    columns = [c for c in COLUMNS if c[0] in COMPACT] if compact else COLUMNS
    rows = []
    for e in summary:
        if e["task"] != task:
            continue
        if e["keep"] == 1.0 and e["selector"] != "full":
            continue  # identical to full prefill (every token kept); kept in results.json and the plots
        with_ci = not compact or columns is COLUMNS
        over = "!" if e.get("num_over_budget") else ""
        rows.append([e["selector"], policy_label(e["keep"]), str(e["n"]), f"{100 * e['kept_fraction']['mean']:.1f}{over}"]
                    + [fmt(col[1](e), *col[2:]) if with_ci or col[0] in ("acc", "acc-full") else fmt_mean(col[1](e), *col[2:])
                       for col in columns])
    return rows


def fmt_mean(ci: dict | None, digits: int = 2) -> str:
    return "-" if not ci or ci["n"] == 0 or ci["mean"] is None or math.isnan(ci["mean"]) else f"{ci['mean']:.{digits}f}"


def headers(compact: bool = False) -> list[str]:
    names = [col[0] for col in COLUMNS if not compact or col[0] in COMPACT]
    return ["selector", "keep", "n", "kept%"] + [SHORT.get(n, n) if compact else n for n in names]


def text_table(summary: list[dict], html: bool = False) -> str:
    """Per task: the compact table (at most 120 columns), then a warning when n is too small for the CIs."""
    out = []
    for task in dict.fromkeys(e["task"] for e in summary):
        rows = [headers(compact=True)] + table_rows(summary, task, compact=True)
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        tokens = next(e["prompt_tokens"]["mean"] for e in summary if e["task"] == task)
        out.append(f"task {task} (~{tokens:.0f} prompt tokens; acc, acc-full: mean [95% bootstrap CI], others: means)")
        for i, r in enumerate(rows):
            out.append("  ".join(c.ljust(w) if j < 1 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))))
            if i == 0:
                out.append("  ".join("-" * w for w in widths))
        out.append("")
    smallest = min((e["n"] for e in summary), default=0)
    if summary and smallest < MIN_N:
        out.append(f"warning: n = {smallest} examples per row: 95% bootstrap CIs from fewer than {MIN_N} examples are rough")
        out.append("         and wide; raise --samples before ranking selectors by them")
    over = [e for e in summary if e.get("num_over_budget")]
    if over:
        most = max(over, key=lambda e: e["num_over_budget"] / e["n"])
        out.append(f"kept%!: in {len(over)} row(s) (up to {most['num_over_budget']} of {most['n']} examples) the forced "
                   "first/last tokens (--keep-first + --keep-last) exceed ceil(keep x n): the selectors keep only them,")
        out.append("         so nothing is being compared there; use longer --lengths, a higher --keep or a lower --keep-last")
    out.append("speedup*: estimated from this eval's stage times, not measured end to end (spcli bench measures it)")
    written = "results.json and report.html" if html else "results.json (and report.html with --html)"
    out.append(f"every column with its CI: {written}; columns: spcli eval --help")
    return "\n".join(out)


def markdown_table(summary: list[dict], task: str) -> str:
    lines = ["| " + " | ".join(headers()) + " |", "|" + "---|" * len(headers())]
    lines += ["| " + " | ".join(r) + " |" for r in table_rows(summary, task)]
    return "\n".join(lines)


def write_json(path: Path, results: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=1, allow_nan=True))
    os.replace(tmp, path)


def _series(summary, task, selector, key, getter):
    pts = sorted((e["keep"], getter(e)) for e in summary  # auto policies: points of their own (auto_points)
                 if e["task"] == task and e["selector"] == selector and not is_auto(e["keep"]))
    pts = [(k, ci) for k, ci in pts if ci and ci["n"] and not math.isnan(ci["mean"])]
    return [k for k, _ in pts], [c["mean"] for _, c in pts], [c["lo"] for _, c in pts], [c["hi"] for _, c in pts]


def auto_points(ax, summary, task, selector, getter, color) -> None:
    """auto:P policies as stars with their CI, at their mean kept fraction."""
    for e in summary:
        ci = getter(e)
        if e["task"] == task and e["selector"] == selector and is_auto(e["keep"]) and ci and ci["n"]:
            x = e["kept_fraction"]["mean"]
            ax.errorbar([x], [ci["mean"]], yerr=[[ci["mean"] - ci["lo"]], [ci["hi"] - ci["mean"]]], color=color,
                        marker="*", markersize=11, ls="none", capsize=3)
            ax.annotate(e["keep"], (x, ci["mean"]), textcoords="offset points", xytext=(5, 5), fontsize=7, color=color)


def plot(summary: list[dict], out_dir: Path) -> list[Path]:
    """quality_<task>.png (accuracy, first-token agreement, KL vs keep) and speedup_<task>.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for task in dict.fromkeys(e["task"] for e in summary):
        selectors = [s for s in dict.fromkeys(e["selector"] for e in summary if e["task"] == task) if s != "full"]
        full = next(e for e in summary if e["task"] == task and e["selector"] == "full")
        panels = [("accuracy (contains)", lambda e: e["metrics"][TASK_METRIC]),
                  ("first 16 tokens = full prefill's", lambda e: e["metrics"]["prefix_match"]),
                  ("KL(full || pruned), nats", lambda e: e["metrics"]["kl"])]
        if full["metrics"]["needle_kept"]["n"]:
            panels.append(("fraction of needle tokens kept", lambda e: e["metrics"]["needle_kept"]))
        fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4))
        for ax, (title, get) in zip(axes, panels):
            ref = get(full)
            if ref["n"] and not math.isnan(ref["mean"]):
                ax.axhline(ref["mean"], color="k", ls="--", lw=1, label="full prefill")
                ax.axhspan(ref["lo"], ref["hi"], color="k", alpha=0.08)
            for i, s in enumerate(selectors):
                x, y, lo, hi = _series(summary, task, s, title, get)
                if x:
                    line, = ax.plot(x, y, marker=MARKERS[i % len(MARKERS)], ls=STYLES[i % len(STYLES)], label=s)
                    ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.15)
                    auto_points(ax, summary, task, s, get, line.get_color())
            ax.set_xlabel("keep rate (auto: its mean kept fraction)")
            ax.set_title(title)
            if not title.startswith("KL"):
                ax.set_ylim(-0.05, 1.05)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=8)
        fig.suptitle(f"{task}: quality vs keep rate (n={full['n']}, 95% bootstrap CI)")
        fig.tight_layout()
        written.append(out_dir / f"quality_{task}.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)

        fig, ax = plt.subplots(figsize=(5.5, 4))
        ax.axhline(1.0, color="k", ls="--", lw=1, label="full prefill")
        for i, s in enumerate(selectors):
            x, y, lo, hi = _series(summary, task, s, "speedup", lambda e: e["speedup"])
            if x:
                line, = ax.plot(x, y, marker=MARKERS[i % len(MARKERS)], ls=STYLES[i % len(STYLES)], label=s)
                ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.15)
        ax.set_xlabel("keep rate")
        ax.set_yscale("log")
        ax.set_ylabel("TTFT speedup (selector cost included)")
        ax.set_title(f"{task}: speedup estimated from eval timings\n(spcli bench measures it properly)", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        written.append(out_dir / f"speedup_{task}.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    return written


def write_html(path: Path, results: dict, images: list[Path]) -> None:
    """One self-contained page: the tables and the plots inlined as base64 PNGs."""
    summary = results["summary"]
    parts = ["<html><head><meta charset='utf-8'><title>spcli eval</title><style>"
             "body{font-family:sans-serif;margin:2em} td,th{padding:2px 8px;border-bottom:1px solid #ddd;"
             "text-align:right} td:first-child{text-align:left}</style></head><body><h1>spcli eval</h1>",
             f"<pre>{html.escape(json.dumps(results['config'], indent=1))}</pre>"]
    for task in dict.fromkeys(e["task"] for e in summary):
        parts.append(f"<h2>{html.escape(task)}</h2><table><tr>" + "".join(f"<th>{h}</th>" for h in headers()) + "</tr>")
        for r in table_rows(summary, task):
            parts.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>")
        parts.append("</table>")
        for img in images:
            if img.stem.endswith(task):
                data = base64.b64encode(img.read_bytes()).decode()
                parts.append(f"<img src='data:image/png;base64,{data}' style='max-width:100%'>")
    parts.append("</body></html>")
    path.write_text("\n".join(parts))
