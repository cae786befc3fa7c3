"""`spcli status DIR`: progress per Slurm array task and overall (spcli.slurm.status holds the logic)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

HELP = (
    "Progress of an output directory: per array task and overall, rows done/total, failed rows, "
    "requeues, and the state Slurm reports (squeue/sacct) or, without Slurm, what the directory shows. "
    "Works for plain `spcli run` directories too.\n\n"
    "Phases: done (every shard committed), running, waiting (pending, requeued, not started), "
    "unknown (stopped or interrupted; nothing says whether it runs again), failed (ended unfinished "
    "and will not run again: resubmit the same command to continue).\n\n"
    "Exit codes: 0 done; 3 not done yet; 4 failed (a task failed, even while others run); "
    "2 DIR is not an spcli output directory."
)


def register(app: typer.Typer) -> None:
    @app.command(name="status", help=HELP)
    def _cmd(
        out: Annotated[Path, typer.Argument(metavar="DIR", help="Output directory of `spcli run` or `spcli slurm submit`.", show_default=False)],
        as_json: Annotated[bool, typer.Option("--json", help="One JSON object: totals, phase, exit_code and a list of tasks.")] = False,
        slurm: Annotated[bool, typer.Option("--slurm/--no-slurm", help="Ask squeue/sacct (when present) for the tasks' states.")] = True,
    ) -> None:
        import orjson

        from spcli.slurm.status import collect, render

        status = collect(out, ask_slurm=slurm)
        if as_json:
            typer.echo(orjson.dumps(status.to_dict(), option=orjson.OPT_INDENT_2).decode())
        else:
            typer.echo(render(status))
        raise typer.Exit(status.exit_code)
