"""Terminal rendering: the run summary, one row's kept/dropped prompt, and comparisons (rich or plain text).

Plain mode (pipes, grep, diff) marks runs with brackets that prompts practically never hold, instead of
styles: `⟦kept chunk⟧`, `⟮dropped⟯`, `⟪forced⟫`; in a comparison `⟦kept in both⟧`, `⟬A:kept only in A⟭`,
`⟬B:kept only in B⟭`, `⟮neither⟯`. (ASCII markers such as `[kept]` or `.dropped.` collided with the prompt's
own brackets and periods.)
"""

from __future__ import annotations

import json

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from spcli.inspect import compare as cmp
from spcli.inspect.summary import KEEP_BINS, Summary
from spcli.inspect.tokens import DROPPED, FORCED, KEPT, TokenView, importance_levels, split_runs, token_runs

# Kept chunks alternate two hues so that chunk boundaries show; dropped text is dimmed. Named colours, so
# that a 16-colour terminal (the default TERM) still shows two different codes.
COLOR = {KEPT: ("black on bright_cyan", "black on bright_green"), FORCED: "bold black on #d7af5f", DROPPED: "grey50"}
MONO = {KEPT: ("bold", "bold underline"), FORCED: "reverse", DROPPED: "dim"}  # --no-color: attributes only
HEAT_KEPT = ("#ffffd7", "#ffffaf", "#ffff87", "#ffd787", "#ffaf87", "#ff8787", "#ff5f87", "#ff5f5f")  # backgrounds, black text
HEAT_DROPPED = ("grey23", "grey27", "grey30", "grey35", "grey39", "grey42", "grey46", "grey50")  # foregrounds: still dim
DIFF = {cmp.BOTH: "bright_white on grey30", cmp.ONLY_A: "black on #87d787", cmp.ONLY_B: "black on #d7afff", cmp.NEITHER: "grey50"}
DIFF_MONO = {cmp.BOTH: "bold", cmp.ONLY_A: "bold underline", cmp.ONLY_B: "reverse", cmp.NEITHER: "dim"}
PLAIN = {KEPT: "⟦{}⟧", FORCED: "⟪{}⟫", DROPPED: "⟮{}⟯"}
PLAIN_DIFF = {cmp.BOTH: "⟦{}⟧", cmp.ONLY_A: "⟬A:{}⟭", cmp.ONLY_B: "⟬B:{}⟭", cmp.NEITHER: "⟮{}⟯"}


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def header_line(view_row: dict, num_tokens: int | None = None) -> str:
    """One line: id, prompt tokens, kept tokens, keep rate, finish reason, output (JSON-quoted)."""
    r = view_row
    if r.get("error") is not None:
        return f"{r['id']} | error: {r['error']}"
    n = num_tokens if num_tokens is not None else r["num_prompt_tokens"]
    size = r.get("group_size") or 1
    shared = (f" | document kept with {size - 1} other question{'s' if size > 2 else ''} (group {r['group']})"
              if r.get("group") is not None and size > 1 else "")
    return (f"{r['id']} | {n} prompt tokens | kept {r['num_kept_tokens']} ({pct(r.get('keep_rate'))}){shared} | "
            f"{r.get('finish_reason')} | output: {json.dumps(r.get('output'), ensure_ascii=False)}")


def plain_row(view: TokenView) -> str:
    body = "".join(PLAIN[run.state].format(run.text) for run in token_runs(view))
    lines = [header_line(view.row, view.num_tokens)]
    if view.note:
        lines.append(view.note)
    if view.warning:
        lines.append(f"warning: {view.warning}")
    return "\n".join(lines + [body])


def row_text(view: TokenView, mono: bool = False) -> Text:
    """The prompt as rich Text; with importance (colour mode) each token is tinted by its quantile."""
    text = Text()
    styles = MONO if mono else COLOR
    if view.importance is None or mono:
        for run in token_runs(view):
            style = styles[run.state]
            text.append(run.text, style[run.chunk_index % 2] if run.state == KEPT else style)
        return text
    levels = importance_levels(view.importance, len(HEAT_KEPT)).tolist()
    states = [FORCED if f else (KEPT if k else DROPPED) for f, k in zip(view.is_forced.tolist(), view.is_kept.tolist())]
    keys = [(s, i // view.chunk % 2 if s == KEPT else 0, lv) for i, (s, lv) in enumerate(zip(states, levels))]
    for start, end in split_runs(keys):
        state, parity, level = keys[start]
        if state == KEPT:
            style = f"black on {HEAT_KEPT[level]}" + (" underline" if parity else "")
        else:
            style = COLOR[FORCED] if state == FORCED else HEAT_DROPPED[level]
        text.append("".join(view.pieces[start:end]), style)
    return text


def legend(view: TokenView, mono: bool, keep_first: int, keep_last: int) -> Text:
    styles = MONO if mono else COLOR
    forced = Text("  forced (first/last): ").append(f"{keep_first}/{keep_last}", styles[FORCED])
    if view.importance is None or mono:
        t = Text("kept ").append(" chunk ", styles[KEPT][0]).append(" chunk ", styles[KEPT][1])
        t.append(f" ({view.chunk} tokens)  dropped: ").append("text", styles[DROPPED])
        return t.append_text(forced)
    t = Text("kept: importance low ")
    for c in HEAT_KEPT:
        t.append(" ", f"on {c}")
    t.append(" high, every other chunk ").append("underlined", "underline")
    t.append(f" ({view.chunk} tokens)  dropped: ")
    for c in HEAT_DROPPED[::2]:
        t.append("t", c)
    t.append(" (lighter = more important)")
    return t.append_text(forced)


def row_renderable(view: TokenView, mono: bool, keep_first: int, keep_last: int) -> Group:
    parts = [Text(header_line(view.row, view.num_tokens), style="bold", no_wrap=True, overflow="ellipsis")]
    if view.note:
        parts.append(Text(view.note))
    if view.warning:
        parts.append(Text(f"warning: {view.warning}", style="yellow"))
    parts += [legend(view, mono, keep_first, keep_last), Text(), row_text(view, mono)]
    return Group(*parts)


PREFILL_SUM = {False: "summed over batches, each once", True: "estimated from the rows: each row holds its batch's time"}


ESTIMATE_CAVEAT = ("an estimate, linear in tokens: fixed costs per batch make a full prefill cheaper, attention's "
                   "quadratic cost dearer; --baseline DIR (a keep 1.0 run of these rows) measures it")


def prefill_line(s: Summary) -> Text:
    """This run's base prefill against a full prefill of the same rows, measured or estimated (and how)."""
    full = s.full_prefill
    if full is None:
        return Text("base prefill time saved: unknown (no base prefill time recorded)")
    about = "" if full.is_measured else "about "
    saved = s.saved_prefill_s
    text = (f"base prefill {s.prefill_s:.1f} s against {about}{full.seconds:.1f} s for a full prefill ({full.how}): "
            f"{about}{saved:.1f} s saved, for {s.speculate_s:.1f} s of speculation")
    if s.speculate_s > saved:
        return Text(f"{text}; the speculator cost more than it saved", style="yellow")
    return Text(text)


def summary_renderable(s: Summary) -> Table:
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    state = "finished" if s.is_finished else "not finished (running, interrupted or waiting for Slurm tasks)"
    t.add_row("run", f"{s.out}: {state}")
    pending = "unknown" if s.num_pending is None else str(s.num_pending)
    t.add_row("rows", f"{s.num_rows} done, {s.num_failed} failed, {pending} pending "
                      f"(shards {s.num_shards_done}/{s.num_shards} done)")
    t.add_row("tokens", f"{s.num_prompt_tokens} prompt -> {s.num_kept_tokens} kept: prefill work saved "
                        f"{s.num_saved_tokens} tokens ({pct(s.saved_fraction)}), at the cost of speculator "
                        f"{s.speculate_s:.1f} s ({pct(s.speculator_share)} of wall time)")
    t.add_row("", prefill_line(s))
    if s.full_prefill is not None and not s.full_prefill.is_measured:
        t.add_row("", ESTIMATE_CAVEAT)
    q = s.keep_quantiles
    t.add_row("keep rate", f"by tokens {pct(s.keep_by_tokens)} (kept / prompt tokens over all rows)")
    if q:
        t.add_row("", f"by rows: mean {pct(s.keep_mean)}, " + ", ".join(f"{k} {pct(v)}" for k, v in q.items()))
        t.add_row("", keep_histogram(s.keep_histogram))
    if s.sharing is not None:
        for i, line in enumerate(s.sharing.lines()):
            t.add_row("groups" if i == 0 else "", Text(line))
    if s.ttft_quantiles:
        t.add_row("TTFT", ", ".join(f"{k} {v:.3f} s" for k, v in s.ttft_quantiles.items()))
    rate = "-" if s.prompt_tokens_per_s is None else f"{s.prompt_tokens_per_s:.0f}"
    out_rate = "-" if s.output_tokens_per_s is None else f"{s.output_tokens_per_s:.1f}"
    t.add_row("time", f"wall {s.wall_s:.1f} s, {rate} prompt tokens/s, {out_rate} output tokens/s "
                      f"({s.num_output_tokens} generated); speculator {s.speculate_s:.1f} s, "
                      f"base prefill {s.prefill_s:.1f} s ({PREFILL_SUM[s.is_prefill_estimated]})")
    items = [f"{k} {v}" for k, v in s.config.items()]
    label = "config" if len(s.configs) < 2 else "config (latest)"
    for i, group in enumerate((items[:3], items[3:10], items[10:])):  # models; selection and scoring; the rest
        t.add_row(label if i == 0 else "", ", ".join(group))
    if len(s.configs) > 1:
        from spcli.io.manifest import history_lines

        lines = history_lines([{"rows": c.num_rows, "parts": c.parts, "differences": c.differences} for c in s.configs])
        for i, line in enumerate(lines):
            t.add_row("history" if i == 0 else "", Text(line))
    if s.errors:
        for i, e in enumerate(s.errors):
            t.add_row("errors" if i == 0 else "", Text(f"{e.count} x {e.message}  (e.g. {e.example})"))
    else:
        t.add_row("errors", "none")
    return t


def keep_histogram(counts: list[int], width: int = 30) -> Text:
    """Rows per 10% keep-rate bin, from the first non-empty bin to the last."""
    used = [i for i, c in enumerate(counts) if c] or [0]
    top = max(counts) or 1
    lines = []
    for i in range(used[0], used[-1] + 1):
        label = f"{100 * i // KEEP_BINS}-{100 * (i + 1) // KEEP_BINS}%"
        lines.append(f"{label:>8} {'#' * round(width * counts[i] / top)} {counts[i]}")
    return Text("\n".join(lines))


def timing_text(t: cmp.RunTiming | None) -> str:
    if t is None:
        return ""
    ttft = "-" if t.ttft_p50_s is None else f"{t.ttft_p50_s:.3f} s"
    return f": wall {t.wall_s:.1f} s, TTFT p50 {ttft}, speculator {t.speculate_s:.1f} s"


def comparison_table(c: cmp.Comparison, limit: int) -> Group:
    n = len(c.rows)
    head = Text(f"A: {c.out_a} (keep {c.keep_a}){timing_text(c.timing_a)}\n"
                f"B: {c.out_b} (keep {c.keep_b}){timing_text(c.timing_b)}\n"
                f"{n} ids in both, outputs match for {c.num_match} ({pct(c.num_match / n if n else None)}); "
                f"{c.num_only_in_a} only in A, {c.num_only_in_b} only in B")
    t = Table(show_lines=False)
    for name in ("id", "kept A", "kept B", "only A", "only B", "match", "output A", "output B"):
        t.add_column(name, overflow="fold" if name.startswith("output") else "ellipsis",
                     ratio=3 if name.startswith("output") else None)
    for r in c.rows[:limit]:
        t.add_row(r.id, pct(r.a["keep_rate"]), pct(r.b["keep_rate"]), str(r.num_only_a), str(r.num_only_b),
                  "yes" if r.is_match else "NO", r.a["error"] or r.a["output"] or "", r.b["error"] or r.b["output"] or "")
    more = Text(f"... {n - limit} more (use --limit)") if n > limit else Text()
    return Group(head, t, more)


def answers_renderable(rows: list[dict], num_rows: int, pending: int | None, out) -> Group:
    """`spcli inspect --answers`: the first rows' answers side by side (answers.answer_table's columns); an error
    row shows its error in the output column."""
    left = "" if pending == 0 else f", {pending if pending is not None else 'unknown'} pending"
    head = Text(f"{out}: the first {len(rows)} of {num_rows} committed rows{left}")
    t = Table(show_lines=True)
    names = [c for c in (rows[0] if rows else {}) if c != "error"]
    for name in names:
        t.add_column(name, overflow="fold", ratio=3 if name == "output" else 1)
    for r in rows:
        cells = [json.dumps(v, ensure_ascii=False) if isinstance(v, (list, dict)) else "" if v is None else str(v)
                 for v in (r[c] for c in names)]
        if r.get("error") is not None and "output" in names:
            cells[names.index("output")] = f"error: {r['error']}"
        t.add_row(*cells)
    more = Text(f"... {num_rows - len(rows)} more (use -n, or spcli export)") if num_rows > len(rows) else Text()
    return Group(head, t, more)


def diff_header(view: TokenView, row_b: dict) -> list[str]:
    a = view.row
    same = a.get("output") == row_b.get("output") and a.get("error") is None
    return [f"A: {header_line(a, view.num_tokens)}", f"B: {header_line(row_b)}", f"outputs {'match' if same else 'differ'}"]


def plain_diff(view: TokenView, row_b: dict, runs: list[cmp.DiffRun]) -> str:
    return "\n".join(diff_header(view, row_b) + ["".join(PLAIN_DIFF[r.state].format(r.text) for r in runs)])


def diff_renderable(view: TokenView, row_b: dict, runs: list[cmp.DiffRun], mono: bool) -> Group:
    styles = DIFF_MONO if mono else DIFF
    lines = [Text(h, style="bold", no_wrap=True, overflow="ellipsis") for h in diff_header(view, row_b)]
    key = Text("kept in both ").append("text", styles[cmp.BOTH]).append("  only in A ").append("text", styles[cmp.ONLY_A])
    key.append("  only in B ").append("text", styles[cmp.ONLY_B]).append("  in neither ").append("text", styles[cmp.NEITHER])
    body = Text()
    for r in runs:
        body.append(r.text, styles[r.state])
    return Group(*lines, key, Text(), body)


def make_console(width: int | None, color: bool | None, no_color: bool) -> Console:
    """color: None = styles when stdout is a terminal; True forces them (e.g. for `less -R`)."""
    return Console(width=width, force_terminal=True if color else None, no_color=no_color, highlight=False,
                   soft_wrap=False, emoji=False, markup=False)


def num_lines(view: TokenView, width: int) -> int:
    """Lines the rendered row takes at `width` (header and legend included), to decide on paging."""
    return 4 + sum(1 + len(line) // max(width, 1) for line in "".join(view.pieces).split("\n"))


def print_paged(console: Console, renderable, pager: bool | None, num_lines: int) -> None:
    """Page through `less -R` on a terminal when the text is longer than the screen (pager None = auto)."""
    import os

    if pager is None:
        pager = console.is_terminal and num_lines > console.height
    if pager and console.is_terminal:
        os.environ.setdefault("LESS", "-R")
        with console.pager(styles=True):
            console.print(renderable)
    else:
        console.print(renderable)
