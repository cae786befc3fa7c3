"""`spcli run --pass-through COLS`: input columns carried, unchanged, into the output rows.

The writer asks for a committed batch's values by (shard, row). Both job loops commit a shard's rows in
input order, so each shard is read once, front to back, with only these columns (Parquet) or one JSON
parse per line (JSONL); a row before the reader's position (a retried row) reopens the shard. A record
that cannot be decoded, is over --max-record-bytes, or lacks a column, gets nulls there.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from spcli.errors import ConfigError, InputError
from spcli.io.schema import RowResult, output_schema
from spcli.io.shards import Shard, shard_kind


def check_columns(columns: tuple[str, ...]) -> None:
    """Pass-through names may not shadow the output's own columns."""
    taken = sorted(set(columns) & set(output_schema(save_scores=True).names))
    if taken:
        raise ConfigError(f"--pass-through {','.join(taken)}: the output has its own column(s) of that name; "
                          "rename the input column(s)")


def check_shard(shard: Shard, columns: tuple[str, ...], first: dict | None = None) -> None:
    """A Parquet shard must have every column; a JSONL shard's first record every field (as --id-field)."""
    if shard_kind(shard.path) == "parquet":
        try:
            names = set(pq.read_schema(shard.path).names)
        except (pa.ArrowException, OSError):
            return  # an empty or unreadable file is reported by the reader
        what = "Parquet file has no column"
    else:
        if not isinstance(first, dict):
            return
        names, what = set(first), "the first record has no field"
    missing = [c for c in columns if c not in names]
    if missing:
        raise InputError(f"{shard.path}: {what} {', '.join(map(repr, missing))} (--pass-through); its "
                         f"{'columns' if what.startswith('Parquet') else 'fields'}: {', '.join(sorted(names))}")


class PassThrough:
    def __init__(self, columns: tuple[str, ...], max_record_bytes: int = 8 << 20):
        self.columns, self.max_record_bytes = columns, max_record_bytes
        self._readers: dict[str, tuple[int, Iterator[dict]]] = {}  # shard path -> (next row, its rows' values)
        self._types: dict[str, dict[str, pa.DataType]] = {}  # Parquet shards: their columns' types

    def values(self, rows: list[RowResult]) -> list[dict]:
        """Each row's pass-through values, by column name."""
        return [self._value(r.shard, r.row) for r in rows]

    def arrays(self, rows: list[RowResult]) -> list[tuple[str, pa.Array]]:
        """The values as Arrow columns: a Parquet shard's own types; JSONL's inferred (JSON text where mixed)."""
        values = self.values(rows)
        types = self._types.get(rows[0].shard, {}) if rows else {}
        out = []
        for c in self.columns:
            column = [v[c] for v in values]
            try:
                out.append((c, pa.array(column, type=types.get(c))))
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                out.append((c, pa.array([None if v is None else orjson.dumps(v).decode() for v in column])))
        return out

    def _value(self, path: str, row: int) -> dict:
        at, it = self._readers.get(path, (None, None))
        if at is None or row < at:
            at, it = 0, self._read(path)
        value = None
        while at <= row:
            value = next(it, None)
            at += 1
        self._readers[path] = (at, it)
        return value if isinstance(value, dict) else dict.fromkeys(self.columns)

    def _read(self, path: str) -> Iterator[dict | None]:
        if shard_kind(path) == "parquet":
            pf = pq.ParquetFile(path)
            present = [c for c in self.columns if c in pf.schema_arrow.names]
            self._types[path] = {c: pf.schema_arrow.field(c).type for c in present}
            for batch in pf.iter_batches(columns=present, use_threads=False):
                for d in batch.to_pylist():
                    yield {c: d.get(c) for c in self.columns}
            return
        from spcli.io.read import _lines

        with (gzip.open if shard_kind(path) == "jsonl.gz" else open)(path, "rb") as f:
            for _, line, _, _ in _lines(f, self.max_record_bytes):  # one per line, as rows are numbered
                try:
                    obj = orjson.loads(line.lstrip(b"\xef\xbb\xbf")) if line and line.strip() else None
                except orjson.JSONDecodeError:
                    obj = None
                yield {c: obj.get(c) for c in self.columns} if isinstance(obj, dict) else None
