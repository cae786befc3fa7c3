"""`spcli export`: a run's answers as a table (CSV, JSON Lines or Parquet), one row per record in input order."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

HELP = (
    "Write a run's answers as a table: one row per committed record, in input order, with the chosen columns "
    "(default: id, output, finish_reason, error), the --pass-through columns of the run and, with --join-input, the "
    "input record's own fields (a question, a document id) read again from the input files.\n\n"
    "Works on a finished or a partial run: only committed rows are written, and the count of rows still pending is "
    "printed (on stderr where the table goes to stdout)."
)


def split(text: str | None) -> tuple[str, ...]:
    return tuple(c.strip() for c in text.split(",") if c.strip()) if text else ()


def register(app: typer.Typer) -> None:
    @app.command(name="export", help=HELP)
    def _cmd(
        out: Annotated[Path, typer.Argument(metavar="DIR", help="Output directory of `spcli run`.", show_default=False)],
        fmt: Annotated[Optional[str], typer.Option("--format", metavar="csv|jsonl|parquet", help="Default: the --to file's suffix, else csv.", show_default=False)] = None,
        columns: Annotated[Optional[str], typer.Option(metavar="COLS", help="Output columns, comma-separated (any of `spcli run`'s output columns: docs/guide/run.md). Default: id,output,finish_reason,error. The pass-through columns follow them.", show_default=False)] = None,
        join_input: Annotated[bool, typer.Option("--join-input", help="Also the input record's fields beside each row: every field but the prompt and messages (the document), an output column's name prefixed input.; lists and objects as JSON text.")] = False,
        input_columns: Annotated[Optional[str], typer.Option(metavar="COLS", help="With these input fields only (the prompt too, if named); implies --join-input.", show_default=False)] = None,
        to: Annotated[Optional[Path], typer.Option(metavar="FILE", help="Write the table to FILE (replaced whole). Default: stdout.", show_default=False)] = None,
    ) -> None:
        from spcli.inspect.answers import answer_table
        from spcli.inspect.export import format_for, render, save
        from spcli.inspect.outputs import load_run
        from spcli.inspect.summary import pending_rows

        kind = format_for(fmt, to)
        run = load_run(out)
        warn = lambda text: typer.echo(f"spcli: warning: {text}", err=True)
        table = answer_table(run, split(columns), join_input, split(input_columns), warn)
        data = render(table, kind)
        pending = pending_rows(run)
        left = ("the run is finished" if pending == 0 else "pending rows unknown" if pending is None
                else f"{pending} row{'' if pending == 1 else 's'} pending: not committed yet (run the same `spcli run` "
                     "again to finish them)")
        if to is None:
            typer.echo(data.decode("utf-8"), nl=False)
            typer.echo(f"spcli: exported {table.num_rows} rows of {out}; {left}", err=True)
            return
        save(data, to)
        typer.echo(f"wrote {table.num_rows} rows of {out} to {to} ({kind}); {left}")
