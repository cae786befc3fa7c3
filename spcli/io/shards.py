"""The shards of a job: input files (or row ranges of them, Ray's) found from paths, globs and directories, in a stable order."""

from __future__ import annotations

import glob
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from spcli.errors import InputError

SHARD_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".parquet")

log = logging.getLogger("spcli")


@dataclass(frozen=True)
class Shard:
    index: int  # position in the run's shard list: names part files, stable across Slurm tasks
    path: str
    name: str = ""  # prefix of generated ids "<name>:<row>": the file stem, or a relative path where stems collide
    rows: tuple[int, int] | None = None  # a range [start, stop) of the file's rows (spcli run --ray); None: all
    # where a plain JSONL range's first line starts in the file, so that its reader seeks there instead of reading
    # every line before it; 0: read from the file's start (always right, only slower). Not part of its identity.
    offset: int = field(default=0, compare=False)

    @property
    def id_prefix(self) -> str:
        return self.name or Path(self.path).name.split(".")[0]

    @property
    def key(self) -> str:
        """What names this unit of work in logs and bookkeeping: the path, with its row range where it has one."""
        return piece_key(self.path, self.rows)

    @property
    def first_row(self) -> int:
        return 0 if self.rows is None else self.rows[0]


def piece_key(path: str, rows) -> str:
    """`path`, or `path[start:stop]` for a range of its rows (row numbers as `spcli inspect` and errors give them)."""
    return path if rows is None else f"{path}[{rows[0]}:{rows[1]}]"


def shard_kind(path: str) -> str | None:
    name = path.lower()
    for suffix in SHARD_SUFFIXES:
        if name.endswith(suffix):
            return "parquet" if suffix == ".parquet" else ("jsonl.gz" if suffix.endswith(".gz") else "jsonl")
    return None


def _is_shard_file(p: Path, exclude: Path | None) -> bool:
    if not p.is_file() or p.name.startswith(".") or not shard_kind(str(p)):
        return False
    return exclude is None or exclude not in p.resolve().parents


def discover(inputs: tuple[str, ...] | list[str], exclude: str | Path | None = None) -> list[Shard]:
    """Files, globs and directories -> ordered shards (each directory and glob sorted by name).

    Files under `exclude` (the output directory) are never inputs, so `spcli run data/ --out data/out`
    does not read its own parts back on a rerun.
    """
    ex = Path(exclude).resolve() if exclude is not None else None
    paths: list[str] = []
    for item in inputs:
        if os.path.isdir(item):
            files = sorted(p for p in Path(item).rglob("*") if p.is_file() and (ex is None or ex not in p.resolve().parents))
            found = [str(p) for p in files if _is_shard_file(p, ex)]
            skipped = [os.path.relpath(p, item) for p in files if str(p) not in found]
            if not found:
                raise InputError(f"{item}: directory has no shards (*.jsonl, *.jsonl.gz, *.parquet)"
                                 + (f"; not shards: {_listed(skipped)}" if skipped else ""))
            if skipped:
                log.warning("%s: skipped %d file%s that %s not shards (*.jsonl, *.jsonl.gz, *.parquet): %s", item,
                            len(skipped), "" if len(skipped) == 1 else "s", "is" if len(skipped) == 1 else "are",
                            _listed(skipped))
            paths.extend(found)
        elif os.path.isfile(item):
            if shard_kind(item) is None:
                raise InputError(f"{item}: not a shard (expected .jsonl, .jsonl.gz or .parquet)")
            paths.append(item)
        elif glob.has_magic(item):
            found = sorted(p for p in glob.glob(item, recursive=True) if _is_shard_file(Path(p), ex))
            if not found:
                raise InputError(f"{item}: glob matches no shards")
            paths.extend(found)
        else:
            raise InputError(f"{item}: no such file or directory")
    unique = list(dict.fromkeys(os.path.abspath(p) for p in paths))
    return [Shard(i, p, name) for i, (p, name) in enumerate(zip(unique, id_prefixes(unique)))]


def _listed(names: list[str], most: int = 10) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def id_prefixes(paths: list[str]) -> list[str]:
    """File stems, made unique where two shards share one (a/train.jsonl, b/train.jsonl -> a/train, b/train)."""
    stems = [Path(p).name.split(".")[0] for p in paths]
    if len(set(stems)) == len(stems):
        return stems
    root = os.path.commonpath([os.path.dirname(p) for p in paths])
    counts = {s: stems.count(s) for s in stems}
    out = []
    for p, s in zip(paths, stems):
        rel = os.path.relpath(os.path.dirname(p), root)
        out.append(s if counts[s] == 1 or rel == "." else f"{rel}/{s}")
    if len(set(out)) < len(out):  # train.jsonl beside train.jsonl.gz: the whole relative name
        out = [os.path.relpath(p, root) for p in paths]
    return out
