"""`spcli eval`."""

from __future__ import annotations

import typer

from spcli.errors import NotImplementedFeature


def register(app: typer.Typer) -> None:
    @app.command(name="eval")
    def _cmd() -> None:
        """Not implemented yet."""
        raise NotImplementedFeature("spcli eval is not implemented yet")
