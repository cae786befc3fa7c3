"""Reading a Parquet shard: record batches streamed page by page from a start row, each row a Record or an error row."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from spcli.config.run import FieldConfig
from spcli.config.sampling import SAMPLING_PARAMS
from spcli.errors import InputError
from spcli.io.count import is_empty
from spcli.io.records import Record, bad_record, to_record, too_long_record
from spcli.io.shards import Shard

PARQUET_BATCH_ROWS = 1024


PARQUET_BUFFER_BYTES = 1 << 20  # stream column chunks page by page: memory stays flat with row-group size


def open_parquet(shard: Shard) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(shard.path, buffer_size=PARQUET_BUFFER_BYTES)
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"{shard.path}: not a readable Parquet file ({e})") from e


def parquet_columns(pf: pq.ParquetFile, shard: Shard, fields: FieldConfig) -> list[str]:
    names = set(pf.schema_arrow.names)
    if fields.prompt not in names and fields.messages not in names:
        raise InputError(f"{shard.path}: Parquet file has no {fields.prompt!r} or {fields.messages!r} column "
                         f"(columns: {', '.join(sorted(names))}); name yours with --prompt-field or --messages-field")
    if fields.id != FieldConfig().id and fields.id not in names:
        raise InputError(f"{shard.path}: Parquet file has no {fields.id!r} column (--id-field); its columns: "
                         f"{', '.join(sorted(names))}")
    if fields.instruction != FieldConfig().instruction and fields.instruction not in names:
        raise InputError(f"{shard.path}: Parquet file has no {fields.instruction!r} column (--instruction-field); its "
                         f"columns: {', '.join(sorted(names))}")
    wanted = [fields.id, fields.prompt, fields.messages, fields.instruction, "keep", *SAMPLING_PARAMS]  # io/params.py
    return list(dict.fromkeys(c for c in wanted if c in names))


def _record_bytes(obj: dict, fields: FieldConfig, limit: int) -> int:
    """UTF-8 size of a row's prompt or message contents (exact only where it could exceed `limit`)."""
    texts = [obj.get(fields.prompt)]
    if isinstance(obj.get(fields.messages), list):
        texts += [m.get("content") for m in obj[fields.messages] if isinstance(m, dict)]
    texts = [t for t in texts if isinstance(t, (str, bytes))]
    size = sum(len(t) for t in texts)
    if 4 * size <= limit:  # a character is at most 4 bytes
        return size
    return sum(len(t) if isinstance(t, bytes) else len(t.encode("utf-8", "surrogatepass")) for t in texts)


def rows_of(batch: pa.RecordBatch) -> Iterator[dict | str]:
    """A batch's rows as dicts; a row whose strings are not valid UTF-8 comes as the problem's text."""
    try:
        yield from batch.to_pylist()
    except UnicodeDecodeError:
        for i in range(batch.num_rows):
            try:
                yield batch.slice(i, 1).to_pylist()[0]
            except UnicodeDecodeError as u:
                yield f"invalid UTF-8 at byte {u.start} of a string column"


def read_parquet(shard: Shard, fields: FieldConfig, start_row: int, limit: int) -> Iterator[Record]:
    if is_empty(shard.path):
        return
    pf = open_parquet(shard)
    columns = parquet_columns(pf, shard, fields)
    row = start_row
    for batch in parquet_parts(pf, columns, shard, start_row, pf.metadata.num_rows):
        for obj in rows_of(batch):
            yield row_record(obj, shard, row, fields, limit)
            row += 1


def parquet_parts(pf: pq.ParquetFile, columns: list[str], shard: Shard, lo: int, hi: int,
                  batch_size: int = PARQUET_BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """The record batches of rows lo .. hi - 1 of a Parquet shard (`pf` open), in `columns`, row group by row group;
    unreadable data is the InputError row_group_batches raises for it."""
    first = 0  # row group g's first row
    for g in range(pf.num_row_groups):
        num_rows = pf.metadata.row_group(g).num_rows
        if first < hi and first + num_rows > lo:
            row = first
            for batch in row_group_batches(pf, g, first, num_rows, columns, shard, batch_size):
                part = batch.slice(max(0, lo - row), max(0, min(hi, row + batch.num_rows) - max(lo, row)))
                row += batch.num_rows
                if part.num_rows:
                    yield part
        first += num_rows


def row_group_batches(pf: pq.ParquetFile, g: int, first: int, num_rows: int, columns: list[str], shard: Shard,
                      batch_size: int = PARQUET_BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """Row group g's record batches (its rows first .. first + num_rows - 1); unreadable data is an InputError naming
    the file, the row group and its rows."""
    batches = pf.iter_batches(batch_size=batch_size, row_groups=[g], columns=columns, use_threads=False)
    while True:
        try:
            batch = next(batches, None)
        except (pa.ArrowException, OSError) as e:
            raise InputError(f"{shard.path}: corrupt Parquet data in row group {g} (rows {first}-{first + num_rows - 1}): {e}") from e
        if batch is None:
            return
        yield batch


def row_record(obj: dict | str, shard: Shard, row: int, fields: FieldConfig, limit: int) -> Record:
    """The record of one Parquet row (rows_of's value: a dict, or the text of its Unicode problem)."""
    if isinstance(obj, str):
        return bad_record(shard, row, obj)
    if (size := _record_bytes(obj, fields, limit)) > limit:
        row_id = obj.get(fields.id)
        return too_long_record(shard, row, size, limit, None if row_id in (None, "") else (str(row_id), False))
    return to_record({k: v for k, v in obj.items() if v is not None}, shard, row, "parquet", fields)
