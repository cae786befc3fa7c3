"""`spcli inspect`: the summary of a run, one row's kept/dropped prompt, an HTML report, two runs compared."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from spcli.errors import ConfigError

HELP = (
    "Show what a run kept and dropped.\n\n"
    "Without --id/--row: a summary of the run (rows done/failed/pending, keep rate, prefill work and time saved, "
    "prompt and output tokens/s, TTFT, configuration, errors grouped by message). The time saved is this run's base "
    "prefill against a full prefill of the same rows: measured in a keep 1.0 run with --baseline, else estimated "
    "(linear in tokens) and labelled so.\n\n"
    "With --id or --row: that row's prompt re-tokenised with the run's tokenizer; kept tokens shown normally, "
    "dropped ones dimmed, kept chunks shaded alternately, forced first/last tokens marked, and tokens tinted by "
    "importance when the run used --save-scores.\n\n"
    "When stdout is not a terminal the prompt is written with plain markers instead, brackets that prompts "
    "practically never hold: ⟦kept chunk⟧ ⟮dropped⟯ ⟪forced⟫; comparing, ⟦kept in both⟧ ⟬A:only in A⟭ "
    "⟬B:only in B⟭ ⟮in neither⟯."
)


def register(app: typer.Typer) -> None:
    @app.command(name="inspect", help=HELP)
    def _cmd(
        out: Annotated[Path, typer.Argument(metavar="DIR", help="Output directory of `spcli run`.", show_default=False)],
        row_id: Annotated[Optional[str], typer.Option("--id", metavar="ID", help="Show the row with this id.")] = None,
        row: Annotated[Optional[int], typer.Option(metavar="N", help="Show the N-th row of the outputs (0-based, in input order).")] = None,
        failed: Annotated[bool, typer.Option("--failed", help="List every failed row: its id, then where and why (redo them with `spcli run ... --retry-failed`).")] = False,
        html: Annotated[Optional[Path], typer.Option(metavar="FILE", help="Write a self-contained HTML report (opens offline): the row, or the first --limit rows with a search box.")] = None,
        limit: Annotated[Optional[int], typer.Option("--limit", "-n", metavar="N", help="Rows listed by --answers (default 10), --html and --compare (default 50).", show_default=False)] = None,
        answers: Annotated[bool, typer.Option("--answers", help="The first -n rows' answers as a table: id, output, finish reason, the --pass-through columns (all of them, or a file: spcli export).")] = False,
        compare: Annotated[Optional[Path], typer.Option(metavar="DIR2", help="Another run's output directory: outputs side by side, whether they match, tokens kept in one and not the other.")] = None,
        baseline: Annotated[Optional[Path], typer.Option(metavar="FULL_DIR", help="A keep 1.0 run of the same rows: the summary's full-prefill time is measured there instead of extrapolated from this run.")] = None,
        width: Annotated[Optional[int], typer.Option(metavar="COLUMNS", help="Text width. Default: the terminal's.")] = None,
        color: Annotated[Optional[bool], typer.Option("--color/--no-color", help="Force styles on, or use no colours (bold/dim only). Default: styles on a terminal.", show_default=False)] = None,
        plain: Annotated[bool, typer.Option("--plain", help="Plain text with ⟦kept⟧ ⟮dropped⟯ ⟪forced⟫ markers (default when piped).")] = False,
        pager: Annotated[Optional[bool], typer.Option("--pager/--no-pager", help="Page long output through less. Default: when longer than the terminal.", show_default=False)] = None,
    ) -> None:
        from spcli.inspect import terminal
        from spcli.inspect.outputs import load_run
        from spcli.inspect.tokens import load_view

        if row_id is not None and row is not None:
            raise ConfigError("give --id or --row, not both")
        if limit is not None and limit < 1:
            raise ConfigError(f"--limit must be >= 1, got {limit}")
        run = load_run(out)
        if answers:
            from spcli.inspect.answers import answer_table
            from spcli.inspect.summary import pending_rows

            table = answer_table(run)
            rows = table.slice(0, limit or 10).to_pylist()
            console = terminal.make_console(width, color, no_color=color is False)
            console.print(terminal.answers_renderable(rows, table.num_rows, pending_rows(run), out))
            return
        limit = limit or 50
        if failed:
            t = run.table(["id", "error"])
            lines = [f"{i}\t{e}" for i, e in zip(t.column("id").to_pylist(), t.column("error").to_pylist()) if e is not None]
            typer.echo("\n".join(lines) if lines else f"no failed rows in {out}")
            return
        other = load_run(compare) if compare is not None else None
        console = terminal.make_console(width, color, no_color=color is False)
        if row is not None:
            row_id = run.find(index=row)["id"]
        if html is not None:
            from spcli.inspect.report import write_report

            write_report(html, run, other, row_id, limit, load_run(baseline) if baseline else None)
            typer.echo(f"wrote {html}")
            return
        is_plain = plain or (color is not True and not console.is_terminal)
        if row_id is None:
            if other is None:
                from spcli.inspect.summary import summarize

                console.print(terminal.summary_renderable(summarize(run, load_run(baseline) if baseline else None)))
            else:
                from spcli.inspect.compare import compare_runs

                console.print(terminal.comparison_table(compare_runs(run, other), limit))
            return
        if other is not None:
            from spcli.inspect.compare import diff_view

            view, row_b, runs = diff_view(run, other, row_id)
            if is_plain:
                typer.echo(terminal.plain_diff(view, row_b, runs))
            else:
                terminal.print_paged(console, terminal.diff_renderable(view, row_b, runs, color is False), pager,
                                     terminal.num_lines(view, console.width))
            return
        found = run.find(row_id=row_id)
        if found.get("error") is not None:  # nothing was kept: the header says why
            typer.echo(terminal.header_line(found))
            return
        view = load_view(run, found)
        if is_plain:
            typer.echo(terminal.plain_row(view))
            return
        select = run.config.get("select", {})
        body = terminal.row_renderable(view, color is False, select.get("keep_first", 0), select.get("keep_last", 0))
        terminal.print_paged(console, body, pager, terminal.num_lines(view, console.width))
