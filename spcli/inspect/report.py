"""The HTML report of `spcli inspect --html`: which rows go in, in which order, with which views."""

from __future__ import annotations

from pathlib import Path

from spcli.errors import OutputError
from spcli.inspect import html
from spcli.inspect.outputs import RunOutputs
from spcli.inspect.summary import summarize
from spcli.inspect.tokens import load_tokenizer, load_view


def write_report(path: Path, run: RunOutputs, other: RunOutputs | None, row_id: str | None, limit: int,
                 baseline: RunOutputs | None = None) -> None:
    """One row (row_id) or the first `limit` rows, each re-tokenised; with `other`, the two runs compared;
    baseline: a keep-1.0 run that measures the full prefill time."""
    tokenizer = load_tokenizer(run)
    summary = html.summary_section(summarize(run, baseline))
    if other is not None:
        title, sections = f"{run.out} vs {other.out}", _comparison(run, other, row_id, limit, tokenizer) + [summary]
    elif row_id is not None:  # the asked-for row first, the run's summary below it
        title, sections = str(run.out), [_articles(run, [run.find(row_id=row_id)], tokenizer), summary]
    else:
        rows = first_rows(run, limit)
        title, sections = str(run.out), [summary, html.row_list(rows), _articles(run, rows, tokenizer)]
    try:
        path.write_text(html.document(title, sections), encoding="utf-8")
    except OSError as e:
        raise OutputError(f"{path}: cannot write the HTML report ({e.strerror})") from e


def first_rows(run: RunOutputs, limit: int) -> list[dict]:
    rows = []
    for r in run.rows():
        rows.append(r)
        if len(rows) == limit:
            break
    return rows


def _articles(run: RunOutputs, rows: list[dict], tokenizer) -> str:
    articles = []
    for i, r in enumerate(rows):
        if r.get("error") is not None:
            articles.append(html.row_article(None, r, i))
            continue
        try:
            articles.append(html.row_article(load_view(run, r, tokenizer), r, i))
        except OutputError as e:  # the input moved or changed: show the numbers without the prompt
            articles.append(html.row_article(None, r, i, error=str(e)))
    return f'<section class="rows">{"".join(articles)}</section>'


def _comparison(run: RunOutputs, other: RunOutputs, row_id: str | None, limit: int, tokenizer) -> list[str]:
    from spcli.inspect.compare import compare_runs, diff_view

    comparison = compare_runs(run, other)
    rows = [r for r in comparison.rows if r.id == row_id] if row_id is not None else comparison.rows[:limit]
    if not rows:
        raise OutputError(f"no row with id {row_id!r} in both {run.out} and {other.out}")
    articles = []
    for i, r in enumerate(rows):
        if r.a["error"] is None:
            articles.append(html.diff_article(*diff_view(run, other, r.id, tokenizer), i))
        else:
            articles.append(html.row_article(None, r.a, i))
    return [html.comparison_section(comparison), html.compare_list(rows), f'<section class="rows">{"".join(articles)}</section>']
