"""`spcli inspect`."""

from __future__ import annotations

import typer

from spcli.errors import NotImplementedFeature


def register(app: typer.Typer) -> None:
    @app.command(name="inspect")
    def _cmd() -> None:
        """Not implemented yet."""
        raise NotImplementedFeature("spcli inspect is not implemented yet")
