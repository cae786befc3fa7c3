"""Counting a shard's rows without reading its records, and finding a JSONL file's line offsets (Ray's row ranges)."""

from __future__ import annotations

import gzip
import os
import zlib
from itertools import islice

import pyarrow as pa
import pyarrow.parquet as pq

from spcli.io.shards import Shard, shard_kind

SCAN_BYTES = 1 << 22  # a plain JSONL file's newlines are counted 4 MiB at a time (line_offsets, count_positions)


def count_rows(shard: Shard) -> int | None:
    """Records in a shard (in its row range, where it has one): Parquet metadata, or a count of JSONL's non-blank
    lines (gzip decompressed on the way)."""
    return _count(shard, blank=False)


def count_positions(shard: Shard) -> int | None:
    """Row numbers a whole file spans (what a row range cuts): its Parquet rows, or its JSONL lines, blank ones
    included (a JSONL record's row is its line index)."""
    return _count(shard, blank=True)


def line_offsets(path: str, rows: list[int]) -> list[int]:
    """Where each of these lines (ascending line indices) of a plain JSONL file starts, in bytes: what a range's
    reader seeks to (Shard.offset). Newlines are counted a block at a time, not read line by line; a line past
    the file's end gets 0 (read from the start)."""
    found, want = [], iter(rows)
    target = next(want, None)
    line, at = 0, 0
    with open(path, "rb") as f:
        while target is not None and (block := f.read(SCAN_BYTES)):
            pos = 0
            while target is not None and line + block.count(b"\n", pos) >= target:
                while line < target:
                    pos = block.index(b"\n", pos) + 1
                    line += 1
                found.append(at + pos)
                target = next(want, None)
            line += block.count(b"\n", pos)
            at += len(block)
    return found + [0] * (len(rows) - len(found))


def _count(shard: Shard, blank: bool) -> int | None:
    kind = shard_kind(shard.path)
    start, stop = shard.rows or (0, None)
    try:
        if is_empty(shard.path):
            return 0
        if kind == "parquet":
            n = pq.ParquetFile(shard.path).metadata.num_rows
            return n if shard.rows is None else max(0, min(n, stop) - start)
        if kind == "jsonl" and blank and shard.rows is None:
            return _count_lines(shard.path)
        with (gzip.open if kind == "jsonl.gz" else open)(shard.path, "rb") as f:
            lines = islice(f, start, stop) if shard.rows else f
            return sum(1 for line in lines if blank or line.strip())
    except (OSError, EOFError, zlib.error, pa.ArrowException):
        return None


def _count_lines(path: str) -> int:
    """A plain file's lines (the last one with or without its newline), counted a block at a time."""
    lines, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(SCAN_BYTES):
            lines += block.count(b"\n")
            last = block[-1:]
    return lines + (last != b"\n")


def is_empty(path: str) -> bool:
    try:
        return os.path.getsize(path) == 0
    except OSError:
        return False
