"""Atomic part files and the manifest that commits them.

A part is written to a temp file, fsync'ed and renamed into place; then the manifest is replaced
(temp + fsync + rename + directory fsync). A part the manifest does not list does not exist for
readers or for a resume, and is removed when a run starts.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import orjson
import pyarrow.parquet as pq

from spcli.io.schema import RowResult, to_dict, to_table

PART_RE = re.compile(r"^part-(\d{5})-(\d{5})\.(parquet|jsonl)$")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)


def part_name(shard_index: int, seq: int, fmt: str) -> str:
    return f"part-{shard_index:05d}-{seq:05d}.{'parquet' if fmt == 'parquet' else 'jsonl'}"


def write_part(out: Path, name: str, rows: list[RowResult], fmt: str, save_scores: bool) -> None:
    """Write one part atomically. fmt: parquet | jsonl (the openai format writes its own lines beside)."""
    path = out / name
    fd, tmp = tempfile.mkstemp(prefix="." + name + ".", suffix=".tmp", dir=out)
    try:
        with os.fdopen(fd, "wb") as f:
            if fmt == "parquet":
                pq.write_table(to_table(rows, save_scores), f, compression="zstd")
            else:
                for r in rows:
                    f.write(orjson.dumps(to_dict(r, save_scores)) + b"\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(out)


def part_shard(name: str) -> int | None:
    """The shard index a part (or its temp file) belongs to."""
    m = PART_RE.match(name.lstrip(".").split(".tmp")[0].rsplit(".", 1)[0] if name.endswith(".tmp") else name)
    return int(m.group(1)) if m else None


def remove_uncommitted(out: Path, committed: set[str], shard_indices: set[int]) -> list[str]:
    """Delete this writer's part and temp files that no manifest lists. Returns the names removed.

    Only parts of `shard_indices` are touched: other Slurm tasks own the other shards.
    """
    removed = []
    for p in out.iterdir():
        is_temp = p.name.startswith(".part-") and p.name.endswith(".tmp")
        if not (is_temp or PART_RE.match(p.name)) or part_shard(p.name) not in shard_indices:
            continue
        if is_temp or p.name not in committed:
            p.unlink(missing_ok=True)
            removed.append(p.name)
    return removed
