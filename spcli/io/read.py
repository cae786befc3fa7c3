"""Stream records from JSONL (plain or gzip) and Parquet shards, starting at a given row."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from spcli.config import FieldConfig
from spcli.errors import InputError
from spcli.io.records import Record, Shard, shard_kind, to_record

PARQUET_BATCH_ROWS = 1024


def read_records(shard: Shard, fields: FieldConfig, start_row: int = 0) -> Iterator[Record]:
    """Yield the shard's records from `start_row` on, in order; bad records carry `error`."""
    kind = shard_kind(shard.path)
    if kind == "parquet":
        yield from _read_parquet(shard, fields, start_row)
    else:
        yield from _read_jsonl(shard, fields, start_row, kind)


def _read_jsonl(shard: Shard, fields: FieldConfig, start_row: int, kind: str) -> Iterator[Record]:
    opener = gzip.open if kind == "jsonl.gz" else open
    try:
        with opener(shard.path, "rb") as f:
            for row, line in enumerate(f):
                if row < start_row:
                    continue
                if not line.strip():
                    continue  # blank lines are not records
                try:
                    obj = orjson.loads(line)
                except orjson.JSONDecodeError as e:
                    where = f"{shard.path}:line {row + 1}"
                    try:
                        line.decode("utf-8")
                        reason = f"malformed JSON ({e.msg} at column {e.colno})"
                    except UnicodeDecodeError as u:
                        reason = f"invalid UTF-8 at byte {u.start}"
                    rec = Record(shard.index, row, f"{shard.path.rsplit('/', 1)[-1].split('.')[0]}:{row}")
                    rec.error = f"{where}: {reason}"
                    yield rec
                    continue
                yield to_record(obj, shard, row, kind, fields)
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise InputError(f"{shard.path}: compressed file is truncated or corrupt ({e})") from e
    except OSError as e:
        raise InputError(f"{shard.path}: cannot read ({e})") from e


def parquet_columns(pf: pq.ParquetFile, shard: Shard, fields: FieldConfig) -> list[str]:
    names = set(pf.schema_arrow.names)
    if fields.prompt not in names and fields.messages not in names:
        raise InputError(f"{shard.path}: Parquet file has no {fields.prompt!r} or {fields.messages!r} column (columns: {', '.join(sorted(names))})")
    wanted = [fields.id, fields.prompt, fields.messages, "max_tokens", "keep", "temperature"]
    return [c for c in wanted if c in names]


def _read_parquet(shard: Shard, fields: FieldConfig, start_row: int) -> Iterator[Record]:
    try:
        pf = pq.ParquetFile(shard.path)
        columns = parquet_columns(pf, shard, fields)
        first_row = 0
        groups = []
        for g in range(pf.num_row_groups):
            rows = pf.metadata.row_group(g).num_rows
            if first_row + rows > start_row:
                groups.append(g)
            else:
                first_row += rows
        if not groups:
            return
        row = first_row
        for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, row_groups=groups, columns=columns):
            for obj in batch.to_pylist():
                if row >= start_row:
                    yield to_record({k: v for k, v in obj.items() if v is not None}, shard, row, "parquet", fields)
                row += 1
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
        raise InputError(f"{shard.path}: not a readable Parquet file ({e})") from e


def count_rows(shard: Shard) -> int | None:
    """Rows in a shard when cheap to know: Parquet metadata, or a line count of plain JSONL."""
    kind = shard_kind(shard.path)
    try:
        if kind == "parquet":
            return pq.ParquetFile(shard.path).metadata.num_rows
        if kind == "jsonl":
            with open(shard.path, "rb") as f:
                return sum(1 for line in f if line.strip())
    except (OSError, pa.ArrowInvalid):
        return None
    return None
