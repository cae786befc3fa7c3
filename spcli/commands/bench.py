"""`spcli bench`."""

from __future__ import annotations

import typer

from spcli.errors import NotImplementedFeature


def register(app: typer.Typer) -> None:
    @app.command(name="bench")
    def _cmd() -> None:
        """Not implemented yet."""
        raise NotImplementedFeature("spcli bench is not implemented yet")
