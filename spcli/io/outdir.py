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


def check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out}: output path exists and is not a directory")


def check_not_ray(out: Path) -> None:
    """A directory that `spcli run --ray` writes splits its shards among actor slots: only --ray goes on with it."""
    from spcli.io.manifest import read_manifests

    if out.is_dir() and any((d.get("task") or {}).get("ray") for d in read_manifests(out)):
        raise OutputError(f"{out} holds a run made by spcli run --ray; go on with --ray (the same command)")


def prepare_out(out: Path) -> Path:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError as e:
        raise OutputError(f"{out}: output path exists and is not a directory") from e
    except OSError as e:
        raise OutputError(f"{out}: output directory cannot be created ({e.strerror})") from e
    if not out.is_dir():
        raise OutputError(f"{out}: output path exists and is not a directory")
    return out
