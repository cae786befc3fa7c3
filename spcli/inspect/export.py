"""`spcli export`'s file formats: a table of answers (answers.py) as CSV, JSON Lines or Parquet.

CSV: one header line, then a line per row; null is an empty field, a list or struct (kept_indices, logprobs,
sampling) its JSON text. JSON Lines: one object per row, lists and structs as JSON. Parquet: the table as it is.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from spcli.errors import ConfigError, OutputError

FORMATS = ("csv", "jsonl", "parquet")


def format_for(fmt: str | None, to: Path | None) -> str:
    """--format, else the --to file's suffix (.csv, .jsonl, .parquet), else csv."""
    if fmt is None:
        suffix = to.suffix.lstrip(".").lower() if to is not None else ""
        fmt = suffix if suffix in FORMATS else "csv"
    if fmt not in FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if fmt == "parquet" and to is None:
        raise ConfigError("--format parquet writes a file: give --to FILE")
    return fmt


def render(table: pa.Table, fmt: str) -> bytes:
    """The table in that format."""
    if fmt == "parquet":
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="zstd")
        data = sink.getvalue().to_pybytes()
    elif fmt == "jsonl":
        data = b"".join(orjson.dumps(row) + b"\n" for row in table.to_pylist())
    else:
        text = io.StringIO()
        writer = csv.writer(text, lineterminator="\n")
        writer.writerow(table.column_names)
        for row in table.to_pylist():
            writer.writerow([_cell(row[c]) for c in table.column_names])
        data = text.getvalue().encode("utf-8")
    return data


def save(data: bytes, to: Path) -> None:
    """Written whole beside `to`, then renamed into place: a reader never sees half a file."""
    tmp = to.with_name(f".{to.name}.tmp")
    try:
        tmp.write_bytes(data)
        tmp.replace(to)
    except OSError as e:
        raise OutputError(f"{to}: cannot write ({e.strerror or e})") from e


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, (list, dict)):
        return orjson.dumps(value).decode()
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
