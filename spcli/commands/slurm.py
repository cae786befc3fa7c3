"""`spcli slurm`."""

from __future__ import annotations

import typer

from spcli.errors import NotImplementedFeature


def register(app: typer.Typer) -> None:
    @app.command(name="slurm")
    def _cmd() -> None:
        """Not implemented yet."""
        raise NotImplementedFeature("spcli slurm is not implemented yet")
