"""`spcli status`."""

from __future__ import annotations

import typer

from spcli.errors import NotImplementedFeature


def register(app: typer.Typer) -> None:
    @app.command(name="status")
    def _cmd() -> None:
        """Not implemented yet."""
        raise NotImplementedFeature("spcli status is not implemented yet")
