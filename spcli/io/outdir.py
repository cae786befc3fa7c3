"""The output folder of a report command (eval, bench, calibrate): created, or a clear error."""

from __future__ import annotations

from pathlib import Path

from spcli.errors import OutputError


def make_out_dir(out: str | Path) -> Path:
    path = Path(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"cannot create --out {path}: {e}") from e
    return path
